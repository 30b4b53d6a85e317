"""Retention on an SST-chain root: drop old version records, then SSTs nobody lists.

Object storage has no locks a reader could hold (the local format's ``flock`` leases),
so readers are protected by time instead, with a **grace period** (``grace_seconds``,
10 minutes by default):

* a version is kept while it is among the newest ``retain``, or while it was superseded
  less than the grace ago (its successor's ``created_at`` is younger than the grace): a
  reader that listed the root and pinned the then-latest version has the grace to fetch
  its files;
* an SST is kept while a kept version lists it, or while the writer's clock in its name
  is younger than the grace: a commit still uploading, or about to publish, loses nothing.

Everything else goes: records first (so no record ever lists a removed file), then the
SSTs no remaining record lists (a loser's orphans, compacted-away chains), then, on a
local root, temporary files older than the grace (a killed writer's half-written ones).
A reader that already built its database keeps reading whatever retention removes (the
cache and the database hold their own copies). The grace must exceed the longest
download of a version and the clock skew between writers; it is a parameter, not a
guarantee against a reader that pins a version it found longer ago than the grace.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ..errors import IqkitError
from .chain import list_versions, read_version, record_key
from .names import CHAIN_SST_DIR
from .objects import ObjectStore

__all__ = ["DEFAULT_GRACE_SECONDS", "ChainCleanup", "collect_chain_garbage"]

DEFAULT_GRACE_SECONDS = 600.0


@dataclass
class ChainCleanup:
    """What one retention run removed and what it could not."""

    removed_versions: list[int] = field(default_factory=list)
    removed_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _written_at(key: str) -> float | None:
    """The writer's clock (seconds) in an SST's name, None for a name not iqkit's."""
    parts = key.rpartition("/")[2].split("-")
    if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit():
        return None
    return int(parts[1]) / 1000


def collect_chain_garbage(
    objects: ObjectStore,
    store: str,
    *,
    retain: int = 1,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
) -> ChainCleanup:
    """Remove ``store``'s versions and SSTs that retention no longer needs (module
    docstring). ``now`` is the time to judge ages by (the current time by default)."""
    if retain < 1:
        raise ValueError(f"retain must keep at least the latest version, got {retain}")
    now = time.time() if now is None else now
    cleanup = ChainCleanup()
    numbers = list_versions(objects, store)
    records = {n: read_version(objects, store, n) for n in numbers}
    kept = set(numbers[-retain:])
    for older, newer in itertools.pairwise(numbers):
        if records[newer].created_at > now - grace_seconds:
            kept.add(older)
    for n in numbers:
        if n in kept:
            continue
        try:
            objects.delete(record_key(store, n))
            cleanup.removed_versions.append(n)
        except IqkitError as exc:
            kept.add(n)  # its files stay with it
            cleanup.problems.append(str(exc))
    used = set().union(*(records[n].files() for n in kept)) if kept else set()
    for key in objects.list(f"{store}/{CHAIN_SST_DIR}"):
        written = _written_at(key)
        if key in used or written is None or written > now - grace_seconds:
            continue
        try:
            objects.delete(key)
            cleanup.removed_files.append(key)
        except IqkitError as exc:
            cleanup.problems.append(str(exc))
    try:  # what killed writers left half-written (a local root's temporary names)
        cleanup.removed_files += objects.remove_stale_temporaries(store, now - grace_seconds)
    except IqkitError as exc:
        cleanup.problems.append(str(exc))
    return cleanup
