"""``iqkit.verify`` / ``python -m iqkit verify``: every file of every retained version of
a chain store checked against what its records say (store/integrity.py), and damaged
columnar twins rebuilt from their SSTs (``repair``).

What is checked, per store: the manifest (its checksum line); every retained version
record (its checksum line, that it parses, names its own files and partitions); every
file a retained record lists, once however many versions share it: that it is there,
its size, and its checksum when the record gives one. A file whose record gives no
checksum (written before files carried one) is checked for its size only and counted as
such. Local files are read where they are; on object storage each file is fetched into a
private temporary folder, never into the reader's cache, so a copy cached earlier cannot
hide damage on the root.

Repair rebuilds a damaged twin from its SST (never the other way round: the SST is
what RocksDB reads and what the twin is made from), only when the SST itself checks out,
and puts it in place only when the rebuilt file is byte for byte the one the record
describes (its checksum matches): a published version never changes. A twin that cannot
be rebuilt exactly (one merged at compaction, or written by another iqkit or pyarrow)
stays reported.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ...errors import IqkitError, ObjectMissingError, UnknownStoreError
from ..integrity import checksum_fd, checksum_file, is_sealed
from ..manifest import StoreManifest
from ..objects import ObjectStore
from .records import ChainFile, list_versions, read_version, record_key
from .stores import chain_store_names, read_chain_manifest

__all__ = ["FileDamage", "VerifyReport", "verify_chain_stores"]


@dataclass(frozen=True)
class FileDamage:
    """One damaged file: the store, the partition and versions that list it (None for
    a manifest; a record's own version), the file's place on the root, and what is
    wrong."""

    store: str
    partition: int | None
    versions: tuple[int, ...]
    file: str
    what: str
    #: True once ``repair`` put the file back as its record describes it.
    repaired: bool = False

    def line(self) -> str:
        where = [f"store {self.store}"]
        if self.partition is not None:
            where.append(f"partition {self.partition}")
        if self.versions:
            v = self.versions
            where.append(f"version {v[0]}" if len(v) == 1 else f"versions {v[0]}..{v[-1]}")
        status = "repaired: " if self.repaired else ""
        return f"{status}{', '.join(where)}: {self.file}: {self.what}"


@dataclass
class VerifyReport:
    """What ``verify`` checked and found (``damaged``: one entry per damaged file)."""

    root: str
    stores: list[str] = field(default_factory=list)
    versions: int = 0
    files: int = 0
    bytes: int = 0
    #: Files checked for their size only (their records give no checksum).
    unchecked: int = 0
    damaged: list[FileDamage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing is damaged (repaired files count as mended)."""
        return all(d.repaired for d in self.damaged)

    def summary(self) -> str:
        bad = sum(not d.repaired for d in self.damaged)
        fixed = len(self.damaged) - bad
        stores = f"{len(self.stores)} store{'s' * (len(self.stores) != 1)}"
        line = (
            f"{stores}, {self.versions} versions, {self.files} files "
            f"({self.bytes:,} bytes) checked: "
            + (f"{bad} damaged" if bad else "no damage found")
        )
        if fixed:
            line += f", {fixed} repaired"
        if self.unchecked:
            line += f"; {self.unchecked} files have no checksum (written before iqkit kept them)"
        return line

    def lines(self) -> list[str]:
        return [*(d.line() for d in self.damaged), self.summary()]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"<VerifyReport {self.root}: {self.summary()}>"

    def to_pandas(self):  # type: ignore[no-untyped-def]
        """One row per damaged file (a notebook's view of the report)."""
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "store": d.store,
                    "partition": d.partition,
                    "versions": list(d.versions),
                    "file": d.file,
                    "what": d.what,
                    "repaired": d.repaired,
                }
                for d in self.damaged
            ],
            columns=["store", "partition", "versions", "file", "what", "repaired"],
        )


def verify_chain_stores(
    objects: ObjectStore, stores: list[str] | None = None, *, repair: bool = False
) -> VerifyReport:
    """Check ``stores`` (default: every store on the root) as the module docstring says;
    ``UnknownStoreError`` for a name that is no store."""
    report = VerifyReport(objects.where("").rstrip("/"))
    names = chain_store_names(objects)
    for store in stores or names:
        if store not in names:
            raise UnknownStoreError(store, names)
    with tempfile.TemporaryDirectory(prefix="iqkit-verify-") as scratch:
        for store in stores or names:
            report.stores.append(store)
            _verify_store(objects, store, report, Path(scratch), repair)
    return report


def _verify_store(
    objects: ObjectStore, store: str, report: VerifyReport, scratch: Path, repair: bool
) -> None:
    def damage(partition: int | None, versions: tuple[int, ...], key: str, what: str) -> None:
        report.damaged.append(FileDamage(store, partition, versions, objects.where(key), what))

    manifest: StoreManifest | None = None
    report.files += 1
    try:
        manifest = read_chain_manifest(objects, store)
    except IqkitError as exc:
        damage(None, (), f"{store}/manifest.json", _what(exc))
    # file -> (partition, versions listing it, the ChainFile)
    listed: dict[str, tuple[int, list[int], ChainFile]] = {}
    for version in list_versions(objects, store):
        try:
            record = read_version(objects, store, version)
            if manifest is not None:
                record.check_partitions(manifest.partitions, objects.where(""))
        except LookupError:
            continue  # removed by retention since the listing
        except IqkitError as exc:
            damage(None, (version,), record_key(store, version), _what(exc))
            continue
        report.versions += 1
        report.files += 1
        carries = any(f.checksum for chain in record.partitions.values() for f in chain.files)
        if carries and not is_sealed(objects.read_bytes(record_key(store, version))):
            # Its files carry checksums, so the iqkit that wrote it sealed it too: the
            # checksum line's name was damaged (readers read it right: all else is as
            # written), which a reader's unseal cannot tell from an earlier iqkit's text.
            damage(None, (version,), record_key(store, version), "its checksum line is damaged")
        for p, chain in record.partitions.items():
            for f in chain.files:
                entry = listed.setdefault(f.name, (p, [], f))
                entry[1].append(version)
    for name, (p, versions, f) in sorted(listed.items()):
        wrong = _check(objects, name, f.size, f.checksum, report, scratch)
        sst_ok = wrong is None
        if wrong:
            damage(p, tuple(versions), name, wrong)
        twin = f.twin_name
        if twin is None or f.twin is None:
            continue
        wrong = _check(objects, twin, f.twin, f.twin_checksum, report, scratch)
        if not wrong:
            continue
        fixed = False
        if repair and sst_ok and manifest is not None and f.twin_checksum is not None:
            wrong, fixed = _rebuild_twin(objects, manifest, f, scratch, wrong)
        report.damaged.append(
            FileDamage(store, p, tuple(versions), objects.where(twin), wrong, repaired=fixed)
        )


def _what(exc: BaseException) -> str:
    """An error's one line, less the file's place when it starts with it."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    _head, sep, tail = text.partition(" is damaged: ")
    return tail if sep else text


def _check(
    objects: ObjectStore,
    key: str,
    size: int,
    checksum: str | None,
    report: VerifyReport,
    scratch: Path,
) -> str | None:
    """What is wrong with the file ``key`` (None: nothing)."""
    report.files += 1
    try:
        with _local_copy(objects, key, scratch) as fh:
            actual = os.fstat(fh.fileno()).st_size
            report.bytes += actual
            if actual != size:
                return f"it has {actual} bytes, and its version record says {size}"
            if checksum is None:
                report.unchecked += 1
                return None
            if checksum_fd(fh.fileno()) != checksum:
                return "its checksum does not match its version record"
    except (FileNotFoundError, ObjectMissingError):
        return "the file is missing"
    except (OSError, IqkitError) as exc:
        return f"cannot be read: {_what(exc)}"
    return None


@contextlib.contextmanager
def _local_copy(objects: ObjectStore, key: str, scratch: Path) -> Iterator[BinaryIO]:
    """``key`` open for reading for the block: the root's own file on a local root
    (reached through no link), else a fresh download into ``scratch``, removed after."""
    if objects.root.is_local:
        with objects.open_local_file(key) as fh:
            yield fh
        return
    target = scratch / "file"
    try:
        objects.download(key, target)
        with open(target, "rb") as fh:
            yield fh
    finally:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()


def _rebuild_twin(
    objects: ObjectStore, manifest: StoreManifest, f: ChainFile, scratch: Path, wrong: str
) -> tuple[str, bool]:
    """Rebuild ``f``'s twin from its SST (module docstring): (what to report, whether it
    was put back)."""
    from ..columnar import twins  # pyarrow: imported for a repair only
    from ..partitions.sst_reader import SstFile, UnsupportedSst

    assert f.twin_name is not None and f.twin_checksum is not None
    rebuilt = scratch / "rebuilt.parquet"
    try:
        with (
            _local_copy(objects, f.name, scratch) as sst,
            SstFile(sst, name=objects.where(f.name)) as reader,
        ):
            rows = list(reader.items())  # twin_table skips iqkit's reserved keys
        twins.write_twin_of_rows(rebuilt, manifest, rows)
        if checksum_file(rebuilt) != f.twin_checksum:
            why = "rebuilt from its SST, it differs from the one recorded"
            return f"{wrong} (not repaired: {why})", False
        # Through the root's own writes on either kind of root (locally: a temporary file
        # made in a folder opened through no link, then moved into place), so a link
        # planted beside the twin is never written through.
        objects.delete(f.twin_name)
        objects.put_immutable(f.twin_name, rebuilt)
        return wrong, True
    except (UnsupportedSst, OSError, IqkitError, ValueError) as exc:
        return f"{wrong} (not repaired: {_what(exc)})", False
    finally:
        with contextlib.suppress(FileNotFoundError):
            rebuilt.unlink()

