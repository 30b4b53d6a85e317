"""A store root as Spark jobs pass it to their tasks: resolved on the driver.

Why: Spark's Python workers run in the JVM's working folder, not the driver's current
one (a notebook that ``os.chdir``-ed, a test in a temporary folder), so a relative root
would name a different folder in the tasks than on the driver — staged partitions would
land where the commit does not look for them. An object-storage URL names the same place
everywhere: it passes through as its canonical URL (``StoreRoot.url``), and each executor
opens it with the credentials of its own environment.
"""

from __future__ import annotations

import os

from ..store.roots import parse_root

__all__ = ["driver_root"]


def driver_root(root: str | os.PathLike[str]) -> str:
    """``root`` as every process of a Spark job names it: an absolute local path
    (``file:`` URIs accepted), or an object-storage root's canonical URL (never a folder:
    ``store.roots.parse_root`` tells them apart)."""
    parsed = parse_root(root)
    if parsed.local is None:
        return parsed.url
    return os.path.abspath(os.path.expanduser(parsed.local))
