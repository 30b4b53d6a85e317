"""Which on-disk format a store uses: the one home of that choice.

Two formats exist:

- ``FOLDER`` (layout.py, versions.py, commit.py): a RocksDB folder per partition version,
  a ``LATEST`` file, hard links, renames and ``flock``. It needs a POSIX filesystem, so it
  serves local roots only, and every store made on a local root so far uses it.
- ``CHAIN`` (chain*.py): immutable SSTs under unique names plus one small record per
  version, published with one exclusive create; nothing is renamed or rewritten. It
  serves every root: object storage (``s3://``, ``gs://``, ``abfs://``) and local folders.

A store's format is told by what is in it, never by a setting a reader must know: on an
object root every store is a chain store; under a local root a store whose folder holds
the chain's record folder (``chain/``) or SST folder (``sst/``) is a chain store (one
copied down from object storage, say with ``aws s3 sync``), any other a folder store. A
new store takes ``new_store_format(root)``: the chain format on object roots, the folder
format on local roots for now (docs/DECISIONS.md: why local roots have not moved yet).
"""

from __future__ import annotations

import enum
import os

from .names import CHAIN_RECORDS_DIR, CHAIN_SST_DIR, MANIFEST_FILE
from .roots import StoreRoot, parse_root

__all__ = ["StoreFormat", "new_store_format", "store_format"]


class StoreFormat(enum.Enum):
    FOLDER = "folder"
    CHAIN = "chain"


def new_store_format(root: StoreRoot) -> StoreFormat:
    """The format a store created under ``root`` gets."""
    return StoreFormat.FOLDER if root.local is not None else StoreFormat.CHAIN


def store_format(root: str | os.PathLike[str] | StoreRoot, store: str) -> StoreFormat:
    """The format of ``store`` under ``root``: the existing store's (see the module), or
    the one it would get when created (``new_store_format``). Reads a local root's
    folder only; never creates anything."""
    parsed = parse_root(root)
    if parsed.local is None:
        return StoreFormat.CHAIN
    folder = os.path.join(os.path.abspath(parsed.local), store)
    if any(os.path.isdir(os.path.join(folder, d)) for d in (CHAIN_RECORDS_DIR, CHAIN_SST_DIR)):
        return StoreFormat.CHAIN
    if os.path.isfile(os.path.join(folder, MANIFEST_FILE)):
        return StoreFormat.FOLDER
    return new_store_format(parsed)
