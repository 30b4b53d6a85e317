"""A class data sharing archive for the tests' Spark JVMs, made by ``make test`` before the
tests run.

Why: every Spark JVM a test run starts (each pytest worker's session, and the README's,
the demo's, the notebooks', the cluster's executors, the install-mode and start-up
probes) loads and verifies the same ~15,000 classes from Spark's jars, about 9 of the
~21 CPU-s a session's start and first jobs take with C1 only. JDK 17 can dump the
classes a JVM loaded into an archive at exit (``-XX:ArchiveClassesAtExit``); a JVM
started with ``-XX:SharedArchiveFile`` maps them instead (measured: 21.6 → 12.9 CPU-s
for a session's start and two small jobs). Speed only: a JVM whose class path does not
match the archive's (extra jars first, another Spark) quietly loads its classes as
before (``-Xlog:cds*=off`` keeps the JVM from printing that it did, which would also
corrupt ``spark-class``'s reading of its launcher's output), and no flag changes what
a JVM computes.

This script is the training run: a local session with the tests' class path (the
Makefile starts it with ``-XX:ArchiveClassesAtExit=DEST`` in ``SPARK_SUBMIT_OPTS``)
running what the tests run most: SQL aggregations, Arrow conversions, Python UDFs,
iqkit's data source both ways, a stateful stream on RocksDB and Spark's state reader.

    python tests/spark/jvm_archive.py SCRATCH
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def train(scratch: Path) -> None:
    import pandas as pd
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["IQKIT_CACHE"] = os.fspath(scratch / "iqkit-cache")
    spark = (
        SparkSession.builder.master("local[2, 4]")  # as tests/conftest.py's session
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        frame = spark.createDataFrame(
            pd.DataFrame({"user": [f"u{i % 7}" for i in range(200)], "amount": range(200)})
        )
        frame.groupBy("user").agg(F.sum("amount"), F.count("*")).toPandas()
        frame.select(F.udf(lambda s: s.upper(), "string")("user")).collect()
        root = os.fspath(scratch / "stores")
        frame.write.format("iqkit").option("store", "totals").option(
            "key", "user"
        ).option("partitions", "2").mode("overwrite").save(root)
        spark.read.format("iqkit").option("store", "totals").load(root).count()

        inputs = scratch / "input"
        inputs.mkdir()
        checkpoint = os.fspath(scratch / "checkpoint")
        spark.conf.set(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        for batch in range(2):
            (inputs / f"{batch}.json").write_text(f'{{"user": "u{batch}", "amount": 1}}\n')
            stream = spark.readStream.schema("user string, amount long").json(os.fspath(inputs))
            (stream.groupBy("user").count().writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True)
             .start().awaitTermination())  # fmt: skip
        spark.read.format("statestore").load(checkpoint).collect()
    finally:
        spark.stop()
    _wait_for_the_jvm(spark)


def _wait_for_the_jvm(spark) -> None:
    """Close the JVM's stdin and wait for it to exit. Quirk: the JVM writes the archive as
    it exits, which it does when its stdin (a pipe from this process) closes — otherwise
    only after this script ended, while the tests' first JVMs were already starting
    without it (~20 s of dumping measured after the script's exit)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    if proc is None:  # a gateway this process did not launch
        return
    proc.stdin.close()
    proc.wait(timeout=300)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.rsplit("\n\n", 1)[-1].strip())
    train(Path(sys.argv[1]))
