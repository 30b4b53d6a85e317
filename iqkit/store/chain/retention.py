"""Retention on an SST-chain root: drop old version records, then SSTs nobody lists.

Object storage has no locks a reader could hold, so readers are protected by time
instead, with a **grace period** (``grace_seconds``, 10 minutes by default):

* a version is kept while it is among the newest ``retain``, or while it was superseded
  less than the grace ago (its successor's record is younger than the grace): a reader
  that listed the root and pinned the then-latest version has the grace to fetch its
  files. No fewer can be kept: a reader pins the newest version it lists, and may have
  listed an instant before the next one appeared, however short-lived that one was;
* an SST is kept while a kept version lists it, or while it is younger than the grace:
  a commit still uploading, or about to publish, loses nothing.

Every age is measured by the storage's own clock, never a writer's: objects' modification
times (``ObjectStore.list_modified``: the file system's, or the object service's
``LastModified``, both in the listings retention makes anyway) against the newest
record's (by default ``now``: the record the commit running retention just published).
A writer whose clock is an hour off therefore neither loses its fresh uploads to another
writer's retention (which judged them by the time in their names) nor keeps versions an
hour longer than the grace (the time in a record); and since the newest record is never
younger than the storage's present, ages are never overestimated.

Everything else goes: records first (so no record ever lists a removed file), then the
SSTs no remaining record lists (a loser's orphans, compacted-away chains), then, on a
local root, temporary files older than the grace (a killed writer's half-written ones).
A reader that already built its database keeps reading whatever retention removes (the
cache and the database hold their own copies). The grace must exceed the longest
download of a version and the longest a commit takes between its first upload and its
publish (a publish whose own files are gone is refused: write.py's ``publish_next``); it is
a parameter, not a guarantee against a reader that pins a version it found longer ago
than the grace.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ...errors import IqkitError
from ..names import CHAIN_RECORDS_DIR, CHAIN_SST_DIR
from ..objects import ObjectStore
from .records import read_version, record_key, version_of

__all__ = ["DEFAULT_GRACE_SECONDS", "ChainCleanup", "collect_chain_garbage"]

DEFAULT_GRACE_SECONDS = 600.0


@dataclass
class ChainCleanup:
    """What one retention run removed and what it could not."""

    removed_versions: list[int] = field(default_factory=list)
    removed_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _is_iqkit_sst(key: str) -> bool:
    """Whether ``key`` is named as iqkit names SSTs (write.py's ``sst_key``): retention
    removes nothing else."""
    parts = key.rpartition("/")[2].split("-")
    return len(parts) == 3 and all(p.isascii() and p[:1].isalnum() for p in parts)


def collect_chain_garbage(
    objects: ObjectStore,
    store: str,
    *,
    retain: int = 1,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
) -> ChainCleanup:
    """Remove ``store``'s versions and SSTs that retention no longer needs (module
    docstring). ``now`` is the time to judge ages by, on the storage's clock (by default
    the newest record's modification time)."""
    if retain < 1:
        raise ValueError(f"retain must keep at least the latest version, got {retain}")
    cleanup = ChainCleanup()
    modified: dict[int, float] = {}
    for key, when in objects.list_modified(f"{store}/{CHAIN_RECORDS_DIR}").items():
        n = version_of(key)
        if n is not None:
            modified[n] = when
    numbers = sorted(modified)
    if now is None:
        now = modified[numbers[-1]] if numbers else time.time()
    records = {n: read_version(objects, store, n) for n in numbers}
    kept = set(numbers[-retain:])
    for older, newer in itertools.pairwise(numbers):
        if modified[newer] > now - grace_seconds:
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
    for key, written in objects.list_modified(f"{store}/{CHAIN_SST_DIR}").items():
        if key in used or not _is_iqkit_sst(key) or written > now - grace_seconds:
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
