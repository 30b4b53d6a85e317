"""A RocksDB state store snapshot (``<v>.zip``, ``rocksdb_files``) restored and scanned:
the zip's own files and its metadata checked, the SSTs it lists placed beside them in a
private scratch folder, the database opened read-only through ``partitions.rocks``.

Why a module of its own: restoring a database is a seam of its own (zip entries, SST
placement, RocksDB's errors told apart by file), apart from which files rebuild a version
and how changelogs replay on top (``rocksdb_files``, which reads and checks each file's
bytes and hands them here).

The zip holds RocksDB's own small files (``CURRENT``, ``MANIFEST-*``, ``OPTIONS-*``, an
empty write-ahead log) and ``metadata``: ``"v1\\n"`` and one JSON object whose
``sstFiles`` list each table file's name in the database (``localFileName``), its name
in the checkpoint (``dfsSstFileName``, under the partition's ``SSTs/``) and its size
(``sizeBytes``), and, for a store in column families, ``columnFamilyMapping`` (family
name → the 2-byte id before its keys).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

from ...errors import IqkitError, ObjectMissingError
from ..objects import NotPlainFileError, ObjectStore, link_plain_file
from ..partitions import rocks
from .codecs import StateFileError, UnknownFormatError

__all__ = ["DEFAULT_DELIMITER", "families_of", "restore"]

#: What Spark's merge operator version 1 (the default) puts between two merged values.
DEFAULT_DELIMITER = b","
_METADATA_ENTRY = "metadata"
_METADATA_HEADER = b"v1"
#: The prefix of the name of RocksDB's options file in a snapshot's zip.
_OPTIONS_FILE = "OPTIONS-"
#: Names RocksDB gives its table files; the zip's entries are plain names too.
_SST_NAME = re.compile(r"\d+\.sst")
_PLAIN_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")


def restore(
    objects: ObjectStore,
    raw: bytes,
    where: str,
    sst_folder: str,
    *,
    version: int,
    work_dir: str | os.PathLike[str],
    merge_delimiter: bytes = DEFAULT_DELIMITER,
) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
    """(every key and value of the snapshot ``raw`` (from ``where``) as stored, its
    metadata's column families): its database restored in a folder of ``work_dir``
    (removed after), its SSTs taken from ``sst_folder``, then scanned, merge operands
    still apart in its SSTs joined by ``merge_delimiter``."""
    entries, ssts, families = _unzip(raw, where)
    os.makedirs(work_dir, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f"rocksdb-{version}-", dir=work_dir)
    try:
        for name, data in entries.items():
            if name.startswith(_OPTIONS_FILE) and merge_delimiter != DEFAULT_DELIMITER:
                data = _with_merge_delimiter(data, merge_delimiter)
            with open(os.path.join(folder, name), "xb") as out:
                out.write(data)
        sst_keys = {}
        for local, (dfs, size) in ssts.items():
            sst_key = f"{sst_folder}/{dfs}"
            _place_sst(objects, sst_key, os.path.join(folder, local), size, where)
            sst_keys[local] = objects.where(sst_key)
        rows = _scan(folder, where, sst_keys)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows, families


def families_of(raw: bytes, where: str) -> dict[str, int]:
    """The column families the snapshot ``raw`` names (no database restored)."""
    return _families(_snapshot_metadata(_zip_entries(raw, where), where), where)


def _with_merge_delimiter(options: bytes, delimiter: bytes) -> bytes:
    """A snapshot's RocksDB ``OPTIONS`` file with its string-append merge operator given
    ``delimiter``. Quirk: the file names the operator without its delimiter, and RocksDB
    makes it with its default, ``,``; a key's merge operands that lie in two SSTs are
    joined when read, so a store written with another delimiter (Spark's merge operator
    version 2: none) would read back with a ``,`` between them."""
    spec = "{id=StringAppendOperator;delimiter=" + delimiter.decode("latin-1") + "}"
    return options.replace(
        b"merge_operator=StringAppendOperator\n", f"merge_operator={spec}\n".encode("latin-1")
    )


def _unzip(
    raw: bytes, where: str
) -> tuple[dict[str, bytes], dict[str, tuple[str, int]], dict[str, int]]:
    """(the zip's RocksDB files by name, the SSTs its metadata lists: name in the database
    → (name under ``SSTs/``, size), its column families: name → id, empty for a store
    without)."""
    entries = _zip_entries(raw, where)
    metadata = _snapshot_metadata(entries, where)
    try:
        ssts = {
            str(f["localFileName"]): (str(f["dfsSstFileName"]), int(f["sizeBytes"]))
            for f in metadata.get("sstFiles") or ()
        }
    except (KeyError, TypeError, ValueError):
        raise StateFileError(f"{where}: damaged snapshot metadata") from None
    for local, (dfs, _) in ssts.items():
        if not _SST_NAME.fullmatch(local) or not _PLAIN_NAME.fullmatch(dfs) or local in entries:
            raise StateFileError(f"{where}: its metadata lists a bad SST name ({local}, {dfs})")
    return entries, ssts, _families(metadata, where)


def _families(metadata: Mapping[str, Any], where: str) -> dict[str, int]:
    """A snapshot metadata's column families (``columnFamilyMapping``): name → id."""
    mapping = metadata.get("columnFamilyMapping") or {}
    try:
        return {str(name): int(cf) for name, cf in mapping.items()}
    except (AttributeError, TypeError, ValueError):
        raise StateFileError(f"{where}: damaged columnFamilyMapping") from None


def _zip_entries(raw: bytes, where: str) -> dict[str, bytes]:
    """A snapshot zip's entries by name (RocksDB's files and ``metadata``), each checked
    against its CRC-32."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            # Reading each entry checks its CRC-32 (BadZipFile when it does not match).
            entries = {info.filename: archive.read(info) for info in archive.infolist()}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
            NotImplementedError, ValueError) as exc:  # fmt: skip
        raise StateFileError(f"{where}: not a whole zip file ({exc})") from None
    if _METADATA_ENTRY not in entries:
        raise StateFileError(f"{where}: no {_METADATA_ENTRY} entry (not a RocksDB snapshot)")
    odd = [name for name in entries if not _PLAIN_NAME.fullmatch(name)]
    if odd:
        raise StateFileError(f"{where}: an entry that is no RocksDB file name ({odd[0]!r})")
    return entries


def _snapshot_metadata(entries: dict[str, bytes], where: str) -> dict[str, Any]:
    """The ``metadata`` entry of a snapshot's ``entries`` (taken out of them), parsed."""
    header, _, body = entries.pop(_METADATA_ENTRY).partition(b"\n")
    if header.strip() != _METADATA_HEADER:
        newer = re.fullmatch(rb"v[0-9]{1,9}", header.strip())  # else a damaged header
        raise (UnknownFormatError if newer else StateFileError)(
            f"{where}: snapshot metadata {header[:20]!r} is not supported yet (known: v1)"
        )
    try:
        metadata = json.loads(body)
    except ValueError:
        metadata = None
    if not isinstance(metadata, dict):
        raise StateFileError(f"{where}: damaged snapshot metadata")
    return metadata


def _place_sst(objects: ObjectStore, key: str, target: str, size: int, snapshot: str) -> None:
    """Give the restored database the SST ``key`` as ``target``: a hard link (else a
    copy) on a local checkpoint, a download from object storage; its size checked."""
    where = objects.where(key)
    try:
        local = objects.local_file(key)
        if local is not None:
            link_plain_file(local, target, where)
        else:
            objects.download(key, target)
    except (FileNotFoundError, ObjectMissingError):
        raise StateFileError(f"{where}: missing (snapshot {snapshot} lists it)") from None
    except NotPlainFileError as exc:
        raise StateFileError(exc.strerror or f"{where}: not a plain file") from None
    found = os.path.getsize(target)
    if found != size:
        raise StateFileError(
            f"{where}: {found} bytes, but snapshot {snapshot} lists it with {size} (cut short "
            "or replaced)"
        )


def _scan(folder: str, where: str, sst_keys: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the database restored in ``folder``, opened read-only through
    ``partitions.rocks``. RocksDB verifies each block it reads against its checksum; an
    error naming one of the SSTs (``sst_keys``: name in the database → where it came
    from) is reported against that file, any other against the snapshot ``where``."""
    db = None
    try:
        db = rocks.open_for_read(folder)
        rows: list[tuple[bytes, bytes]] = []
        chunks = rocks.scan_chunks(db, b"", None)  # checks how the scan ended
        try:
            for chunk in chunks:
                rows.extend(chunk)
        finally:
            chunks.close()  # an iterator keeps the database open (rocks.py's quirk)
        return rows
    except Exception as exc:  # rocksdict raises plain Exception; open_for_read iqkit's own
        text = " ".join(str(exc).split()) or type(exc).__name__
        text = re.sub(r"/\S*/(\d+\.sst)", r"\1", text)  # the private folder's path: noise
        text = text.replace(f"{folder}/", "").replace(folder, "the restored snapshot")
        culprit = next((sst for local, sst in sst_keys.items() if local in text), None)
        if culprit is None:
            culprit = _damaged_sst(folder, sst_keys) or where
        kind = "damaged" if isinstance(exc, IqkitError) or "orrupt" in text else "unreadable"
        raise StateFileError(f"{culprit}: {kind}, RocksDB says: {text}") from None
    finally:
        rocks.close_quietly(db)


def _damaged_sst(folder: str, sst_keys: Mapping[str, str]) -> str | None:
    """Which SST (where it came from) fails when read alone, if one does.

    Why: RocksDB reads each table file's properties block when it opens the database,
    and some damage there ("properties unsorted") is reported against the MANIFEST, a
    file of the zip whose bytes its CRC-32 has already vouched for. Only on the way to an
    error: it costs nothing when all is well. Each is read in the scratch folder the
    snapshot was restored in (``folder``'s parent), never outside it."""
    for local, sst in sorted(sst_keys.items()):
        try:
            rocks.check_table_file(os.path.join(folder, local), scratch_dir=os.path.dirname(folder))
        except IqkitError:
            return sst
    return None
