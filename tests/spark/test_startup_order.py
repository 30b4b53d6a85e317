"""``format("iqkit")`` without ceremony, in either start-up order, on real local Spark.

Each case runs in its own Python process (a Spark session's worker interpreter is fixed
when it starts) with ``PYSPARK_PYTHON`` unset and, first on PATH, a ``python3`` that
cannot import iqkit — what a notebook kernel in a virtual environment meets when the
system ``python3`` lacks iqkit.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import run_python_script

_SESSION = """
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
"""

_COMMON = """
import json, os, sys, warnings
root = sys.argv[1]
out = {}
def attempt(name, fn):
    try:
        out[name] = ["ok", fn()]
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
"""


@pytest.fixture(scope="module")
def path_without_iqkit(tmp_path_factory) -> str:
    """PATH whose ``python3`` is a real interpreter that cannot import iqkit."""
    bin_dir = tmp_path_factory.mktemp("bin")
    base = getattr(sys, "_base_executable", sys.executable)
    stub = bin_dir / "python3"
    # -S: no site-packages, so neither iqkit nor anything installed beside it is found;
    # -P: nor the working folder (the clone's root, whose iqkit/ a bare `import iqkit`
    # finds now that it loads no third-party package at import)
    stub.write_text(f'#!/bin/sh\nexec "{base}" -S -P "$@"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    probe = subprocess.run([str(stub), "-c", "import iqkit"], capture_output=True, check=False)
    assert probe.returncode != 0, "the stub python3 must not be able to import iqkit"
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def _run(script: str, root: Path, path: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    env["PATH"] = path
    return run_python_script(textwrap.dedent(script), str(root), env=env)


def test_session_started_before_import_fails_in_one_line_before_any_task(
    tmp_path, path_without_iqkit
):
    root = tmp_path / "stores"
    root.mkdir()
    script = (
        _COMMON
        + _SESSION
        + """
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import iqkit.spark
out["warnings"] = [str(w.message) for w in caught]
from iqkit.spark import register, store_sink, write_store
df = spark.createDataFrame([("a", 1)], "k string, v int")
attempt("register", lambda: register(spark))
attempt("write_store", lambda: write_store(df, root, "t", key="k", partitions=2))
attempt("store_sink", lambda: store_sink(root, "s", key="k", partitions=2) and None)
out["jobs"] = len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
out["root"] = os.listdir(root)
print("RESULT" + json.dumps(out))
"""
    )
    out = _run(script, root, path_without_iqkit)
    for name in ("register", "write_store", "store_sink"):
        kind, message = out[name]
        assert kind == "WorkerPythonError", (name, out[name])
        assert "\n" not in message
        assert "Spark's Python workers run 'python3'" in message
        assert f"PYSPARK_PYTHON={sys.executable}" in message
    (warning,) = [w for w in out["warnings"] if "Python workers" in w]
    assert "cannot import iqkit" in warning
    assert out["jobs"] == 0  # nothing ran on the workers
    assert out["root"] == []  # and nothing was written


def test_session_started_after_import_has_the_format_without_register(tmp_path, path_without_iqkit):
    root = tmp_path / "stores"
    script = (
        _COMMON
        + """
import iqkit.spark  # sets PYSPARK_PYTHON for sessions started from now on
"""
        + _SESSION
        + """
df = spark.createDataFrame([("a", 1), ("b", 2)], "k string, v int")
attempt("write", lambda: df.write.format("iqkit").mode("append").option("store", "t")
        .option("key", "k").option("partitions", 2).save(root))
attempt("read", lambda: sorted((r.k, r.v) for r in
        spark.read.format("iqkit").option("store", "t").load(root).collect()))
attempt("key", lambda: [r.k for r in spark.read.format("iqkit").option("store", "t")
        .option("key", "b").load(root).collect()])
print("RESULT" + json.dumps(out))
"""
    )
    out = _run(script, root, path_without_iqkit)
    assert out["write"] == ["ok", None]
    assert out["read"] == ["ok", [["a", 1], ["b", 2]]]  # typed: the columns written
    assert out["key"] == ["ok", ["b"]]
