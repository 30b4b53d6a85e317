"""The twin of a compacted base: the older twins and the commit's delta merged, not the
base's bytes decoded again.

Why a module of its own: merging is a scan of the twins (``TwinScan``: newest file
wins, tombstones dropped) whose table is written as a twin (``twins.write_twin``), so
it needs both the reader and the writer of twins, and neither of them needs it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..encoding.keyspace import KV_LOWER, KV_UPPER
from ..manifest import StoreManifest
from .scan import TwinScan
from .twins import KEY_BYTES, KEY_FROM, LAYOUT, key_column_of, layout_of, twin_table, write_twin

__all__ = ["write_merged_twin"]


def write_merged_twin(
    path: str | os.PathLike[str],
    manifest: StoreManifest,
    older: Sequence[str | os.PathLike[str]],
    delta_rows: Sequence[tuple[bytes, bytes | None]],
) -> int:
    """Write at ``path`` the twin of a compacted base: the live rows of the twins
    ``older`` (oldest first) with the delta ``delta_rows`` on top, merged in C
    (``TwinScan``) rather than decoded again from the base's bytes."""
    delta = f"{os.fspath(path)}.delta"
    write_twin(delta, twin_table(manifest, delta_rows))
    try:
        table = TwinScan([*older, delta], KV_LOWER, KV_UPPER, manifest=manifest).table()
        if key_column_of(manifest) is not None:
            table = table.drop_columns([KEY_BYTES])  # the scan derived it: not stored
    finally:
        os.unlink(delta)
    # The merge does not keep the files' schema metadata: without its layout the
    # compacted twin would be taken for a stale one and never read.
    metadata = {**(table.schema.metadata or {}), LAYOUT: layout_of(manifest)}
    derived = key_column_of(manifest)
    if derived is not None:
        metadata[KEY_FROM] = derived.encode()
    return write_twin(path, table.replace_schema_metadata(metadata))
