"""Where a store's files live: ``<root>/<store>/...`` (names from names.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import StoreCorruptedError, StoreIOError
from ..query.request import validate_store_name
from .names import (
    JOB_STAGING_PREFIX,
    JOBS_DIR,
    LATEST_FILE,
    LEASES_DIR,
    LOCK_FILE,
    MANIFEST_FILE,
    PARTITIONS_DIR,
    STAGING_PREFIX,
    VERSIONS_DIR,
)
from .roots import local_root


def list_store_names(root: str | os.PathLike[str]) -> list[str]:
    """Names of the stores under ``root`` (folders holding a manifest)."""
    root = local_root(root)
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(e for e in entries if os.path.isfile(os.path.join(root, e, MANIFEST_FILE)))


@dataclass(frozen=True)
class StoreLayout:
    """Paths of one store. Pure path arithmetic: creates nothing."""

    root: Path
    name: str

    @classmethod
    def of(cls, root: str | os.PathLike[str], name: str) -> StoreLayout:
        return cls(local_root(root), validate_store_name(name))

    @property
    def store_dir(self) -> Path:
        return self.root / self.name

    @property
    def manifest(self) -> Path:
        return self.store_dir / MANIFEST_FILE

    @property
    def latest(self) -> Path:
        return self.store_dir / LATEST_FILE

    @property
    def versions_dir(self) -> Path:
        return self.store_dir / VERSIONS_DIR

    def version_record(self, version: int) -> Path:
        return self.versions_dir / f"{version}.json"

    @property
    def partitions_dir(self) -> Path:
        return self.store_dir / PARTITIONS_DIR

    def partition_dir(self, partition: int) -> Path:
        return self.partitions_dir / str(partition)

    def partition_version_dir(self, partition: int, version: int) -> Path:
        """Partition ``partition`` as written by the commit that published ``version``."""
        return self.partition_dir(partition) / str(version)

    def staging_dir(self, partition: int, version: int, token: str) -> Path:
        return self.partition_dir(partition) / f"{STAGING_PREFIX}{version}-{token}"

    @property
    def leases_dir(self) -> Path:
        return self.store_dir / LEASES_DIR

    @property
    def jobs_dir(self) -> Path:
        return self.store_dir / JOBS_DIR

    def job_staging_dir(self, partition: int, job_id: str, attempt: str) -> Path:
        return self.partition_dir(partition) / f"{JOB_STAGING_PREFIX}{job_id}-{attempt}"

    @property
    def lock_file(self) -> Path:
        return self.store_dir / LOCK_FILE


def read_store_text(layout: StoreLayout, path: Path) -> str:
    """The text of one of a store's own small files (manifest, ``LATEST``, a record).

    A missing file raises ``FileNotFoundError`` (what absence means is the caller's
    call); a file that cannot be read raises ``StoreIOError`` and bytes that are not
    UTF-8 raise ``StoreCorruptedError``, both naming the file.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:  # a folder in its place, permissions, I/O errors
        raise StoreIOError(
            f"store {layout.name!r}: cannot read {path}: {exc.strerror or exc}"
        ) from None
    return decode_store_text(layout, path, data)


def decode_store_text(layout: StoreLayout, path: Path, data: bytes) -> str:
    """``data`` (read from ``path``) as UTF-8 text, else ``StoreCorruptedError``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreCorruptedError(
            f"store {layout.name!r}: {path} is damaged: byte {exc.start} "
            f"({data[exc.start : exc.start + 1]!r}) is not UTF-8 text"
        ) from None


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` so that readers see the old file or the whole new one, never half.

    Write a temporary file beside it, fsync, then ``os.replace`` (atomic on POSIX).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def remove_if_exists(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_tree_or_file(path: Path) -> None:
    """Remove a folder tree or a file, whichever ``path`` is (leftovers of any kind)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        remove_if_exists(path)
