"""Small helpers for code that runs inside Spark's Python workers (write and read tasks):
where a task may spill, the tests' fault-injection marker, and one quirk worked around.

Quirk (CPython < 3.12 ``zipimport`` + PySpark): before every task, a PySpark worker calls
``importlib.invalidate_caches()`` (``pyspark.worker_util.setup_spark_files``). On Python
3.11 each ``zipimporter`` then re-reads its archive's whole central directory — and a
worker holds one importer per package imported from ``pyspark.zip`` plus the py4j zip and
Spark's core jar, which PySpark puts on the workers' ``PYTHONPATH``: about 0.1 s per task
on an idle machine and several times that under load, longer than a store key lookup
takes. Those archives belong to the Spark installation and do not change while the
application runs, so their importers may keep the directory they read. Python 3.12 made
``zipimporter.invalidate_caches`` lazy, and there this does nothing.

The first task of a fresh worker still pays (it runs before any iqkit code is loaded);
every later task that worker runs — Spark reuses workers — does not.
"""

from __future__ import annotations

import os
import sys
import zipimport

__all__ = ["consume_marker", "keep_spark_archive_indexes", "spill_dir"]


def keep_spark_archive_indexes() -> int:
    """Make this process's importers of Spark's own archives skip their re-read on
    ``importlib.invalidate_caches()``; return how many importers were changed (0 outside
    a PySpark worker, and on Python 3.12+)."""
    if sys.version_info >= (3, 12):
        return 0
    home = os.environ.get("SPARK_HOME")
    if not home:
        return 0
    inside = os.path.join(os.path.realpath(home), "")
    changed = 0
    for finder in list(sys.path_importer_cache.values()):
        if (
            isinstance(finder, zipimport.zipimporter)
            and "invalidate_caches" not in vars(finder)
            and os.path.realpath(finder.archive).startswith(inside)
        ):
            # An instance attribute shadows the method PathFinder.invalidate_caches calls.
            finder.invalidate_caches = _keep_directory  # type: ignore[method-assign]
            changed += 1
    return changed


def _keep_directory() -> None:
    """The archive is part of the Spark installation: its directory is still valid."""


def spill_dir() -> str | None:
    """Where a task may spill: Spark's local directory for this executor, if it says."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    return dirs.split(",")[0] or None


def consume_marker(marker: str) -> bool:
    """Tests' fault injection: remove ``marker``; ``True`` if this call removed it (so
    exactly one task attempt fails, whichever gets there first)."""
    try:
        os.remove(marker)
    except FileNotFoundError:
        return False
    return True
