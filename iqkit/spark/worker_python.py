"""Which Python Spark's workers run, and whether it can import iqkit — checked on the
driver before any task runs.

Why: Spark starts its Python workers (tasks, data-source planning) with the
``PYSPARK_PYTHON`` the driver process had when the session started, else ``python3`` from
PATH, fixed for the session's life (``SparkContext.pythonExec``; the builder conf
``spark.pyspark.python`` is only read by ``spark-submit``). A notebook that creates its
session before importing iqkit gets workers that cannot import it, and every task then
fails with some 30 lines ending in ``ModuleNotFoundError: No module named 'iqkit'``. This
says so in one line, naming the interpreter and the fix.

Only local masters (``local``, ``local[n]``, ``local-cluster[...]``) are checked: their
workers run on this machine, so asking the same interpreter answers the question. On a
cluster the executors' Python lives elsewhere and only a task could tell.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import warnings
from typing import Any

from ..errors import IqkitError

__all__ = [
    "WorkerPythonError",
    "require_workers_can_import_iqkit",
    "warn_if_active_session_lacks_iqkit",
    "worker_python",
]


class WorkerPythonError(IqkitError):
    """Spark's Python workers run an interpreter that cannot import iqkit."""


def worker_python(spark: Any) -> str:
    """The interpreter Spark's Python workers run for this session (as Spark names it)."""
    return str(getattr(spark.sparkContext, "pythonExec", None) or "python3")


def require_workers_can_import_iqkit(spark: Any) -> None:
    """Raise :class:`WorkerPythonError` (one line) when the session's Python workers,
    on this machine, cannot import iqkit; do nothing for remote masters."""
    master = str(spark.sparkContext.master)
    if not master.startswith("local"):
        return
    exe = worker_python(spark)
    problem = _import_problem(exe, os.environ.get("PATH", ""))
    if problem is None:
        return
    raise WorkerPythonError(
        f"iqkit: Spark's Python workers run {exe!r} ({problem}), which cannot import iqkit: "
        f"set PYSPARK_PYTHON={sys.executable} before the Spark session starts (importing "
        "iqkit.spark first sets it), then restart the session with spark.stop()"
    )


def warn_if_active_session_lacks_iqkit() -> None:
    """A warning (not an error: nothing has failed yet) when a Spark session was started
    before iqkit was imported and its workers cannot import iqkit; ``format("iqkit")``
    is then missing from it too, since Spark looked for it with those workers."""
    if "pyspark.sql" not in sys.modules:
        return  # no session can exist; importing pyspark here would cost start-up time
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        return
    try:
        require_workers_can_import_iqkit(active)
    except WorkerPythonError as exc:
        warnings.warn(str(exc), stacklevel=3)


@functools.lru_cache(maxsize=8)
def _import_problem(exe: str, path: str) -> str | None:
    """``None`` when ``exe`` imports iqkit, else a few words on what it is."""
    resolved = shutil.which(exe, path=path) if os.sep not in exe else exe
    if resolved is None:
        return "not found on PATH"
    if os.path.realpath(resolved) == os.path.realpath(sys.executable):
        return None  # this interpreter: it has iqkit, it is running it
    try:
        done = subprocess.run(
            [resolved, "-c", "import iqkit"],
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{resolved}: {type(exc).__name__}"
    if done.returncode == 0:
        return None
    return resolved if resolved != exe else "no module named 'iqkit'"
