"""What the notebooks in this folder share, so that each one shows only its story.

* :func:`workspace`: a fresh folder next to the notebooks for everything a notebook
  writes (stores, topics, checkpoints, Spark's scratch files, and the readers' cache of
  built databases: ``IQKIT_CACHE`` points into it, so a notebook leaves nothing in
  ``~/.cache/iqkit``); its last cell removes it with :func:`clean_up`. The path is
  relative, so the outputs name the same paths on every machine, and nothing is left in
  ``/tmp``.
* :func:`local_spark`: an ordinary local ``SparkSession`` for iqkit — ``import
  iqkit.spark`` first (Spark's Python workers then run this kernel's interpreter), UTC,
  four shuffle partitions for small data, Python workers' errors as one line — with
  Spark's scratch files under the work folder and the JVM's console output (its startup
  warnings and log lines, which carry timestamps) in ``<work>/spark.log`` instead of the
  notebook.

The notebooks' stored outputs are compared with nbval (``make test``) and regenerated
by ``make notebooks``; see the README, "Notebooks".
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["clean_up", "local_spark", "workspace"]


def workspace(name: str) -> Path:
    """An empty folder ``name`` in the current folder (one a failed earlier run left
    behind is replaced), which also holds this kernel's iqkit cache from now on (an
    absolute path: Spark's Python workers, started later, inherit it and run elsewhere)."""
    path = Path(name)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    os.environ["IQKIT_CACHE"] = str((path / "iqkit-cache").resolve())
    return path


@contextlib.contextmanager
def _console_to(log: Path) -> Iterator[None]:
    """Point this process's stdout and stderr file descriptors at ``log`` while the
    block runs: a child started inside (Spark's JVM) keeps writing there for good.

    Quirk: ipykernel forwards everything written to the kernel's file descriptors 1
    and 2 into the running cell's output, so without this the JVM's startup warnings
    and timestamped log lines would land in whichever cell is running when they arrive.
    Python's own ``print`` goes through ``sys.stdout``, not these descriptors, and is
    unaffected."""
    with open(log, "ab") as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def local_spark(work: Path, app: str) -> Any:
    """A local Spark session (2 cores) whose files stay under ``work``."""
    from pyspark.sql import SparkSession

    import iqkit.spark  # noqa: F401  (before the session: workers run this interpreter)

    scratch = (work / "spark").resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # An exception raised in a Python worker (a data source's option check, a UDF)
        # reaches the notebook as its message, not a worker traceback with local paths.
        .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
        .config("spark.local.dir", str(scratch))
        # The JVM unpacks native libraries into java.io.tmpdir and keeps perf data in
        # /tmp/hsperfdata_<user>: both stay out of /tmp this way.
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData")
    )
    # spark-submit first runs a small launcher JVM, which would leave an empty
    # /tmp/hsperfdata_<user>; SPARK_LAUNCHER_OPTS reaches that JVM only.
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", "-XX:-UsePerfData")
    with _console_to(work / "spark.log"):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def clean_up(work: Path, spark: Any = None) -> None:
    """Stop ``spark`` (if given) and remove the work folder."""
    if spark is not None:
        spark.stop()
    shutil.rmtree(work)
