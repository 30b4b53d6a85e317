"""A store root as Spark jobs pass it to their tasks: absolute, resolved on the driver.

Why: Spark's Python workers run in the JVM's working folder, not the driver's current
one (a notebook that ``os.chdir``-ed, a test in a temporary folder), so a relative root
would name a different folder in the tasks than on the driver — staged partitions would
land where the commit does not look for them.
"""

from __future__ import annotations

import os

from ..store.roots import local_root

__all__ = ["driver_root"]


def driver_root(root: str | os.PathLike[str]) -> str:
    """``root`` as an absolute local path (``file:`` URIs accepted); object-storage URLs
    are refused in one line (``store.roots.local_root``), never taken for a folder."""
    return os.path.abspath(os.path.expanduser(local_root(root, "a Spark job")))
