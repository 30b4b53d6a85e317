"""Which on-disk format a store uses: the one home of that choice.

Two formats exist:

- ``FOLDER`` (layout.py, versions.py, commit.py): a RocksDB folder per partition version,
  a ``LATEST`` file, hard links, renames and ``flock``. It needs a POSIX filesystem, so it
  serves local roots only. Its manifests say ``format_version`` 1.
- ``CHAIN`` (chain*.py): immutable SSTs under unique names plus one small record per
  version, published with one exclusive create; nothing is renamed or rewritten. It
  serves every root: object storage (``s3://``, ``gs://``, ``abfs://``) and local
  folders. Its manifests say ``format_version`` 2 (``names.CHAIN_FORMAT_VERSION``).

A store's format is told by what is in it, never by a setting a reader must know: on an
object root every store is a chain store; under a local root the manifest says which
(a manifest of format 1 whose folder holds the chain's ``chain/`` or ``sst/`` folder and
neither ``LATEST`` nor ``versions/`` is a chain store an earlier iqkit made on object
storage and someone copied down). A new
store takes ``new_store_format(root)``: the chain format everywhere, unless
``IQKIT_LOCAL_FORMAT=folder`` asks for the folder format on a local root (stores made
by earlier iqkits keep opening and taking commits in their own format; see
docs/DECISIONS.md).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os

from .manifest import StoreManifest
from .names import (
    CHAIN_FORMAT_VERSION,
    CHAIN_RECORDS_DIR,
    CHAIN_SST_DIR,
    LATEST_FILE,
    MANIFEST_FILE,
    VERSIONS_DIR,
)
from .roots import StoreRoot, parse_root

__all__ = ["StoreFormat", "as_chain_manifest", "new_store_format", "store_format"]


class StoreFormat(enum.Enum):
    FOLDER = "folder"
    CHAIN = "chain"


#: The variable that picks the format of stores created under a local root from now on:
#: ``chain`` or ``folder`` (existing stores keep theirs whatever it says).
ENV_LOCAL_FORMAT = "IQKIT_LOCAL_FORMAT"
#: What a local root's new stores get when the variable is unset: one format on every root.
DEFAULT_LOCAL_FORMAT = StoreFormat.CHAIN


def new_store_format(root: StoreRoot) -> StoreFormat:
    """The format a store created under ``root`` gets: the chain format on object roots
    (the only one they can hold); on a local root ``IQKIT_LOCAL_FORMAT`` (``chain`` or
    ``folder``), else ``DEFAULT_LOCAL_FORMAT``. Anything else is one-line ``ValueError``."""
    if root.local is None:
        return StoreFormat.CHAIN
    text = os.environ.get(ENV_LOCAL_FORMAT, "").strip().lower()
    if not text:
        return DEFAULT_LOCAL_FORMAT
    try:
        return StoreFormat(text)
    except ValueError:
        raise ValueError(
            f"{ENV_LOCAL_FORMAT}={text!r}: use 'chain' or 'folder' (the format of stores "
            "created under a local root)"
        ) from None


def as_chain_manifest(manifest: StoreManifest) -> StoreManifest:
    """``manifest`` as a chain store records it (its format version says so)."""
    return dataclasses.replace(manifest, format_version=CHAIN_FORMAT_VERSION)


def store_format(root: str | os.PathLike[str] | StoreRoot, store: str) -> StoreFormat:
    """The format of ``store`` under ``root``: the existing store's (see the module), or
    the one it would get when created (``new_store_format``). Reads a local root's
    manifest only; never creates anything. An unreadable manifest counts as the folder
    format, whose reader reports it."""
    parsed = parse_root(root)
    if parsed.local is None:
        return StoreFormat.CHAIN
    folder = os.path.join(os.path.abspath(parsed.local), store)
    try:
        with open(os.path.join(folder, MANIFEST_FILE), "rb") as fh:
            version = json.loads(fh.read()).get("format_version")
    except FileNotFoundError:
        return new_store_format(parsed)
    except (OSError, ValueError, AttributeError):
        return StoreFormat.FOLDER
    if version == CHAIN_FORMAT_VERSION:
        return StoreFormat.CHAIN
    # A folder store being migrated (store/migrate.py) holds the chain's files beside its
    # own until its manifest says 2: while ``LATEST`` or ``versions/`` is there, it is
    # still a folder store (readers must not see a chain written half-way).
    if any(os.path.exists(os.path.join(folder, n)) for n in (LATEST_FILE, VERSIONS_DIR)):
        return StoreFormat.FOLDER
    if any(os.path.isdir(os.path.join(folder, d)) for d in (CHAIN_RECORDS_DIR, CHAIN_SST_DIR)):
        return StoreFormat.CHAIN
    return StoreFormat.FOLDER
