"""Shared fixtures: every test gets a fresh root folder on disk (real RocksDB).
Helper functions live in ``tests/helpers.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root folder for stores (created by the writer side on first use)."""
    return tmp_path / "stores"


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every test that needs one (starting one costs seconds)."""
    from helpers import require_java

    require_java()
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
