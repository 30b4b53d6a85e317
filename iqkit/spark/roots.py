"""A store root as Spark jobs pass it to their tasks: resolved on the driver.

Why: Spark's Python workers run in the JVM's working folder, not the driver's current
one (a notebook that ``os.chdir``-ed, a test in a temporary folder), so a relative root
would name a different folder in the tasks than on the driver — staged partitions would
land where the commit does not look for them. An object-storage URL names the same place
everywhere: it passes through as its canonical URL (``StoreRoot.url``), and each executor
opens it with the credentials of its own environment.
"""

from __future__ import annotations

import contextlib
import os

from ..store.names import CHAIN_RECORDS_DIR, CHAIN_SST_DIR, MANIFEST_FILE
from ..store.roots import parse_root

__all__ = ["driver_root", "remove_uncreated_chain_folders"]


def driver_root(root: str | os.PathLike[str]) -> str:
    """``root`` as every process of a Spark job names it: an absolute local path
    (``file:`` URIs accepted), or an object-storage root's canonical URL (never a folder:
    ``store.roots.parse_root`` tells them apart)."""
    parsed = parse_root(root)
    if parsed.local is None:
        return parsed.url
    return os.path.abspath(os.path.expanduser(parsed.local))


def remove_uncreated_chain_folders(root: str, store: str) -> None:
    """After a failed first write of a chain store under a local root: remove the empty
    folders its tasks' uploads left (``<store>/sst/<p>/``, ``<store>/sst/``,
    ``<store>/chain/`` and ``<store>/``), so a job that created no store leaves no folder
    of one, as a folder store's job does (``store.jobs.remove_uncreated_store``). Only
    empty folders go (``rmdir``), and nothing once the store has a manifest; an object
    root has no folders to remove."""
    local = parse_root(root).local
    if local is None:
        return
    folder = os.path.join(local, store)
    if os.path.exists(os.path.join(folder, MANIFEST_FILE)):
        return
    ssts = os.path.join(folder, CHAIN_SST_DIR)
    try:
        partitions = [os.path.join(ssts, name) for name in os.listdir(ssts)]
    except (FileNotFoundError, NotADirectoryError):
        partitions = []
    for path in [*partitions, ssts, os.path.join(folder, CHAIN_RECORDS_DIR), folder]:
        with contextlib.suppress(OSError):
            os.rmdir(path)
