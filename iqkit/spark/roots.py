"""A store root as Spark jobs pass it to their tasks: resolved on the driver.

Why: Spark's Python workers run in the JVM's working folder, not the driver's current
one (a notebook that ``os.chdir``-ed, a test in a temporary folder), so a relative root
would name a different folder in the tasks than on the driver — staged partitions would
land where the commit does not look for them. An object-storage URL names the same place
everywhere: it passes through as its canonical URL (``StoreRoot.url``), and each executor
opens it with the credentials of its own environment.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..store.roots import StoreRoot, parse_root

__all__ = ["driver_root", "driver_store_root"]


def driver_store_root(root: str | os.PathLike[str] | StoreRoot) -> StoreRoot:
    """``root`` parsed once, as every process of a Spark job names it: a local folder
    made absolute (``file:`` URIs accepted; ``text`` is the absolute path), or an
    object-storage root (``store.roots.parse_root`` tells them apart)."""
    parsed = parse_root(root)
    if parsed.local is None:
        return parsed
    folder = os.path.abspath(os.path.expanduser(parsed.local))
    return dataclasses.replace(parsed, text=folder, local=Path(folder))


def driver_root(root: str | os.PathLike[str] | StoreRoot) -> str:
    """``driver_store_root`` as text: the absolute local path, or an object-storage
    root's canonical URL (a root already parsed so is not parsed again)."""
    parsed = root if isinstance(root, StoreRoot) else driver_store_root(root)
    return parsed.url if parsed.local is None else parsed.text
