"""One progress bar at a time: iqkit's write bar and Spark's console bar
(``spark.ui.showConsoleProgress``) used to redraw the same stderr line over each other.

Spark's bar is drawn by the JVM straight onto the process's stderr, so the write runs in
a child process (a real local Spark, the console bar on as in any PySpark session) whose
stderr the test reads, split by markers the child prints between its steps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import sys, time
    from pyspark.sql import SparkSession, functions as F
    from iqkit.spark import write_store

    spark = (
        SparkSession.builder.master("local[2]").appName("iqkit-progress")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    @F.udf("string")
    def slow(k):  # stages last seconds: Spark draws its bar after 0.5 s
        time.sleep(1)
        return k

    def step(name):
        sys.stderr.write(f"\\n@@{name}\\n")
        sys.stderr.flush()

    rows = spark.range(0, 4, numPartitions=2)
    step("write")
    write_store(
        rows.select(slow(F.col("id").cast("string")).alias("k"), F.col("id").alias("v")),
        sys.argv[1], "s", key="k", value="v", partitions=2,
    )
    step("other job")
    rows.select(slow(F.col("id").cast("string"))).collect()
    step("end")
    spark.stop()
    """
)
_SPARK_BAR = re.compile(r"\[Stage \d+:")


def test_spark_bar_is_set_aside_while_iqkit_writes_and_back_for_other_jobs(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    steps = dict(part.split("\n", 1) for part in done.stderr.split("\n@@")[1:] if "\n" in part)
    assert "iqkit write 's'" in steps["write"] and "rows=4" in steps["write"]
    assert not _SPARK_BAR.search(steps["write"]), steps["write"][-1500:]
    # Spark's bar is back for the session's other jobs: no setting was changed.
    assert _SPARK_BAR.search(steps["other job"]), steps["other job"][-1500:]
    assert "iqkit write" not in steps["other job"]
