"""One local Spark session for every Spark test (starting one costs seconds)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:  # make test checks Java first; this guards direct runs
    pytest.skip("Spark tests need Java 17+ on PATH", allow_module_level=True)


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    # Executors must run this interpreter (the venv's), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2, 4]")  # 2 threads, 4 attempts per task
        .appName("iqkit-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
