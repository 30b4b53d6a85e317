"""The files of Spark's RocksDB state store provider (``RocksDBStateStoreProvider``) for
one partition of one store, read into the live keys and values of a version.

Why here: iqkit reads a checkpoint's state without Spark, so it reads these files itself,
with and without changelog checkpointing
(``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled``).

The partition's folder is ``state/<operator id>/<partition>`` (for the store named
"default"). In it, for state version ``v`` (the state after batch ``v - 1``):

- ``<v>.zip``: a snapshot. It holds RocksDB's own small files (``CURRENT``,
  ``MANIFEST-*``, ``OPTIONS-*``, an empty write-ahead log: Spark writes with the log off
  and flushes before every checkpoint) and ``metadata``: ``"v1\\n"`` and one JSON object
  whose ``sstFiles`` list each table file's name in the database (``localFileName``), its
  name in the checkpoint (``dfsSstFileName``) and its size (``sizeBytes``). Each SST is
  stored once under ``SSTs/`` with a unique name and shared by every version that lists
  it. Without changelog checkpointing every version has one, written at commit.
- ``<v>.changelog`` (changelog checkpointing only): the puts and deletes batch ``v - 1``
  made, compressed as the default provider's files are (``hdfs_files``): Spark's state
  codec, lz4 by default (``codecs``).
  Snapshots are then written now and then by the maintenance task, every
  ``spark.sql.streaming.stateStore.minDeltasForSnapshot`` versions.

Version ``v`` is the newest snapshot at or below ``v`` plus each changelog after it, in
order, as Spark rebuilds it. A snapshot is read by restoring its database in a private
scratch folder (the zip's files, plus the SSTs it lists, hard-linked or copied under their
names in the database) and scanning it read-only through ``partitions.rocks``.

Changelog records (after the decompression): format 1 has no header; it is records
``[key size: int32 BE][key][value size: int32 BE][value]``, a value size of -1 deletes the
key and a key size of -1 ends the file, exactly the default provider's framing. Format 3
is format 1 after two ``writeUTF`` texts (a 2-byte big-endian length, then the bytes):
``"v3"`` and the lineage, a JSON list of ``{"version", "checkpointUniqueId"}`` from the
newest snapshot to ``v - 1``. Formats 2 and 4 (a record-type byte before each record)
are written only for stores in several column families.

Keys and values in the database and in changelogs are Spark's encoding of an UnsafeRow:
one version byte (0), then the row. With
``spark.sql.streaming.stateStore.rowChecksum.enabled`` a value is ``[CRC32-C: int32
LE][length of the rest: int32 LE]`` and then the encoded row, and a changelog's delete
record has the key's CRC32-C (4 bytes) before the key; ``row_checksums=True`` strips both
(not recomputed: the lz4 and RocksDB block checksums, and Hadoop's, cover the same
bytes, and CRC32-C has no fast implementation in Python's standard library). Keys
encoded for prefix or range scans (a session window's store) and transformWithState's
column families (a 2-byte family id before each key, listed in the snapshot's
``columnFamilyMapping``) are refused in one line.

Checkpoint format v2 (``spark.sql.streaming.stateStore.checkpointFormatVersion=2``: 1 by
default in PySpark 4.3; Real-Time Mode queries need 2) names each file
``<v>_<unique id>.zip`` / ``.changelog``: a retried batch leaves files of several attempts
for one version, and the commit log (``commits/<v - 1>``, ``stateUniqueIds``: operator id
→ one list per partition of one id per store, in the order the operator's metadata lists
its stores: a join's four) names the one that counts, and no other attempt's file is ever
read; a changelog's lineage names the files of the versions before it. Spark then also
writes a checksum file of its own, ``<name>.crc``, beside each (JSON: ``algorithm``
CRC32C, ``value``, ``mainFileSize``): its size is checked.

Everything read is checked: Hadoop's ``.<name>.crc`` beside a zip or changelog where it
exists (local and HDFS checkpoints), the zip's own CRC-32 of each entry, a changelog's
compression as far as its codec allows (``codecs``: lz4 blocks carry checksums, the
other codecs' streams none), the record framing to the end record, each SST's size
against the snapshot's metadata, and RocksDB's block checksums while scanning. Anything
found wrong, a file missing, cut short or damaged, raises ``StateFileError`` naming the
file: never rows from it.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import IqkitError, ObjectMissingError
from ..objects import NotPlainFileError, ObjectStore, link_plain_file
from ..partitions import rocks
from .codecs import StateFileError, decompress_state_file
from .hdfs_files import check_hadoop_crc
from .shape import UnsupportedStateError
from .state_schema import read_operator_metadata

__all__ = [
    "PartitionFiles",
    "ReplayPlan",
    "changelog_changes",
    "StateFileError",
    "list_files",
    "list_versions",
    "load_state",
    "oldest_version",
    "plan_replay",
]

#: ``<version>.zip`` / ``<version>.changelog``, with ``_<unique id>`` in format v2.
_STATE_FILE = re.compile(r"(\d+)(?:_([0-9A-Za-z-]+))?\.(zip|changelog)")
_SNAPSHOT, _CHANGELOG = "zip", "changelog"
_INT32_BE = struct.Struct(">i")
_INT32_LE = struct.Struct("<i")
_UTF_LENGTH = struct.Struct(">H")
#: The first byte of every key and value Spark's RocksDB encoder writes (its version).
_ENCODING_VERSION = 0
_METADATA_ENTRY = "metadata"
_METADATA_HEADER = b"v1"
_SST_FOLDER = "SSTs"
#: Names RocksDB gives its table files; the zip's entries are plain names too.
_SST_NAME = re.compile(r"\d+\.sst")
_PLAIN_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")
_COLUMN_FAMILIES = "not supported yet: transformWithState's column families"


@dataclass(frozen=True)
class PartitionFiles:
    """The state files in one partition's folder: for each version, the unique ids of its
    snapshots and of its changelogs (``""`` for a file named without one), and the names
    of every file directly in the folder (checksum files included)."""

    folder: str
    snapshots: Mapping[int, frozenset[str]]
    changelogs: Mapping[int, frozenset[str]]
    names: frozenset[str]

    def versions(self) -> list[int]:
        """Every version that has a snapshot or a changelog, ascending."""
        return sorted(set(self.snapshots) | set(self.changelogs))

    @property
    def unique_ids(self) -> bool:
        """Whether the files carry checkpoint unique ids (checkpoint format v2)."""
        ids = (*self.snapshots.values(), *self.changelogs.values())
        return any(uid for found in ids for uid in found)

    def name(self, version: int, kind: str, uid: str = "") -> str:
        return f"{version}_{uid}.{kind}" if uid else f"{version}.{kind}"

    def key(self, version: int, kind: str, uid: str = "") -> str:
        """The key of ``version``'s ``kind`` ("zip" or "changelog") file."""
        return f"{self.folder}/{self.name(version, kind, uid)}"

    def has(self, version: int, kind: str, uid: str = "") -> bool:
        found = self.snapshots if kind == _SNAPSHOT else self.changelogs
        return uid in found.get(version, ())


def list_files(objects: ObjectStore, partition_dir: str) -> PartitionFiles:
    """The state files directly in ``partition_dir`` (a key relative to the checkpoint
    root, e.g. ``state/0/3``): one listing. ``SSTs/``, ``_metadata/`` and Spark's checksum
    and temporary files are not state files."""
    folder = partition_dir.strip("/")
    found: dict[str, dict[int, set[str]]] = {_SNAPSHOT: {}, _CHANGELOG: {}}
    names: set[str] = set()
    for key in objects.list(folder):
        parent, _, name = key.rpartition("/")
        if parent != folder:
            continue
        names.add(name)
        match = _STATE_FILE.fullmatch(name)
        if match:
            found[match[3]].setdefault(int(match[1]), set()).add(match[2] or "")
    snapshots, changelogs = (
        {v: frozenset(ids) for v, ids in found[kind].items()} for kind in (_SNAPSHOT, _CHANGELOG)
    )
    return PartitionFiles(folder, snapshots, changelogs, frozenset(names))


def list_versions(objects: ObjectStore, partition_dir: str) -> list[int]:
    """The versions of ``partition_dir`` that have a ``<v>.zip`` snapshot or a
    ``<v>.changelog``, ascending. Whether each batch was committed is the commit log's to
    say; ``load_state`` names any file a version lacks."""
    return list_files(objects, partition_dir).versions()


def oldest_version(
    objects: ObjectStore, partition_dir: str, *, files: PartitionFiles | None = None
) -> int | None:
    """The oldest version of ``partition_dir`` that can still be rebuilt: version 1 while
    its changelog is kept (it applies to the empty state), else the oldest snapshot.
    ``None``: no version can be (no state files yet). Spark's retention deletes old
    snapshots and changelogs, never any that a version it keeps needs; a version between
    two retained snapshots may still lack a changelog (``load_state`` names it)."""
    files = files if files is not None else list_files(objects, partition_dir)
    if 1 in files.changelogs:
        return 1
    return min(files.snapshots, default=None)


@dataclass(frozen=True)
class ReplayPlan:
    """Which files rebuild one version: ``base``, the snapshot's (version, unique id), or
    ``None`` for the empty state, then ``changelogs`` in order. ``records`` holds the
    changelogs planning already read (checkpoint format v2 reads a changelog's lineage),
    so replaying never reads a file twice."""

    files: PartitionFiles
    version: int
    base: tuple[int, str] | None
    changelogs: tuple[tuple[int, str], ...]
    records: Mapping[str, tuple[memoryview, int]]

    def keys(self) -> list[str]:
        """The keys of the files replayed, snapshot first."""
        files = self.files
        keys = [files.key(self.base[0], _SNAPSHOT, self.base[1])] if self.base else []
        return keys + [files.key(v, _CHANGELOG, uid) for v, uid in self.changelogs]


def plan_replay(
    objects: ObjectStore, partition_dir: str, version: int, *, files: PartitionFiles | None = None
) -> ReplayPlan:
    """The files that rebuild ``version`` of ``partition_dir`` (``StateFileError`` naming
    one it needs that is missing); ``files`` is a listing already made."""
    if version < 0:
        raise ValueError(f"no state version {version}: versions start at 0")
    files = files if files is not None else list_files(objects, partition_dir)
    if version == 0:
        return ReplayPlan(files, 0, None, (), {})
    planner = (_UniqueIdPlan if files.unique_ids else _Plan)(objects, files)
    base, changelogs = planner.rebuild(version)
    return ReplayPlan(files, version, base, tuple(changelogs), planner.records)


def load_state(
    objects: ObjectStore,
    partition_dir: str,
    version: int,
    *,
    work_dir: str | os.PathLike[str],
    row_checksums: bool = False,
    files: PartitionFiles | None = None,
    plan: ReplayPlan | None = None,
) -> dict[bytes, bytes]:
    """The live keys of ``partition_dir`` at state ``version``, key UnsafeRow bytes →
    value UnsafeRow bytes (Spark's encoding prefix removed): the newest snapshot at or
    below it plus the changelogs after it. Version 0 is the empty state before the first
    batch. ``work_dir`` is a private scratch folder (created if missing) where a snapshot's
    database is restored while it is read, then removed; nothing is ever written into the
    checkpoint. ``files`` is a listing already made (``list_files``), ``plan`` a plan
    already made (``plan_replay``). ``StateFileError`` when a file needed is missing, cut
    short or damaged; ``UnsupportedStateError`` for a store this module cannot read yet
    (one line naming what)."""
    if plan is None or plan.version != version:
        plan = plan_replay(objects, partition_dir, version, files=files)
    files = plan.files
    state: dict[bytes, bytes] = {}
    if plan.base is not None:
        state = _read_snapshot(
            objects, files, *plan.base, work_dir=work_dir, checksums=row_checksums
        )
    for changelog, uid in plan.changelogs:
        key = files.key(changelog, _CHANGELOG, uid)
        records = plan.records.get(key)
        if records is None:
            records = _changelog_records(_read_checked(objects, files, key), objects.where(key))
        _apply(records, state, objects.where(key), row_checksums)
    return state


def changelog_changes(
    objects: ObjectStore, plan: ReplayPlan, keys: list[str], *, row_checksums: bool = False
) -> dict[bytes, bytes | None]:
    """What the changelogs ``keys`` (files of ``plan``, in replay order) change: key
    UnsafeRow bytes → the value after them, or ``None`` where they delete the key. For a
    version built on an older one's state; ``StateFileError`` as ``load_state``."""
    changes: dict[bytes, bytes | None] = {}
    for key in keys:
        where = objects.where(key)
        records = plan.records.get(key)
        if records is None:
            records = _changelog_records(_read_checked(objects, plan.files, key), where)
        for record_key, value in _records(*records, where):
            if value is None:
                # With row checksums a delete's key carries the key's CRC32-C first.
                changes[_row(record_key[4:] if row_checksums else record_key, where, "key")] = None
            else:
                changes[_row(record_key, where, "key")] = _value(value, where, row_checksums)
    return changes


# -- which files rebuild a version ---------------------------------------------------------
class _Plan:
    """Which snapshot and changelogs rebuild a version, for files named without unique
    ids: the newest snapshot at or below it, then every changelog after it."""

    def __init__(self, objects: ObjectStore, files: PartitionFiles) -> None:
        self.objects = objects
        self.files = files
        #: Changelog key → its records (from header on), where planning read it already.
        self.records: dict[str, tuple[memoryview, int]] = {}

    def rebuild(self, version: int) -> tuple[tuple[int, str] | None, list[tuple[int, str]]]:
        """((snapshot version, unique id) or None for the empty state, the (changelog
        version, unique id) pairs to apply after it, in order)."""
        files = self.files
        base = max((v for v in files.snapshots if v <= version), default=0)
        for changelog in range(base + 1, version + 1):
            if changelog in files.changelogs:
                continue
            if not files.changelogs:  # no changelog checkpointing: every version has a zip
                raise StateFileError(
                    f"{self.objects.where(files.key(version, _SNAPSHOT))}: missing"
                )
            raise StateFileError(
                f"{self.objects.where(files.key(changelog, _CHANGELOG))}: missing, and version "
                f"{version} of the state needs it (newest snapshot at or below it: "
                f"{base or 'none'})"
            )
        changelogs = [(v, "") for v in range(base + 1, version + 1)]
        return ((base, "") if base else None), changelogs


class _UniqueIdPlan(_Plan):
    """``_Plan`` for checkpoint format v2: the commit log names the version's files, and
    a changelog's lineage the files of the versions before it, back to a snapshot."""

    def rebuild(self, version: int) -> tuple[tuple[int, str] | None, list[tuple[int, str]]]:
        files = self.files
        uid = self._committed_id(version)
        if files.has(version, _SNAPSHOT, uid):
            return (version, uid), []
        key = files.key(version, _CHANGELOG, uid)
        if not files.has(version, _CHANGELOG, uid):
            raise StateFileError(
                f"{self.objects.where(key)}: missing (the commit log names it, and no "
                f"snapshot {files.name(version, _SNAPSHOT, uid)} is there either)"
            )
        where = self.objects.where(key)
        self.records[key] = records = _changelog_records(
            _read_checked(self.objects, files, key), where
        )
        # Spark's own order: the lineage (newest snapshot to version - 1) and the version
        # itself; the newest of them whose snapshot is there is the base.
        lineage = sorted([*_lineage(records, where), (version, uid)])
        bases = [i for i, (v, u) in enumerate(lineage[:-1]) if files.has(v, _SNAPSHOT, u)]
        if not bases and lineage[0][0] != 1:
            raise StateFileError(f"{where}: no snapshot of the versions its lineage names is there")
        base = lineage[bases[-1]] if bases else None
        after = lineage[bases[-1] + 1 :] if bases else lineage
        first = base[0] + 1 if base else 1
        if [v for v, _ in after] != list(range(first, version + 1)):
            raise StateFileError(f"{where}: its lineage skips versions ({lineage})")
        for v, u in after[:-1]:
            if not files.has(v, _CHANGELOG, u):
                raise StateFileError(
                    f"{self.objects.where(files.key(v, _CHANGELOG, u))}: missing, and version "
                    f"{version} of the state needs it (the lineage of {where} names it)"
                )
        return base, after

    def _committed_id(self, version: int) -> str:
        """The unique id the commit of batch ``version - 1`` recorded for this partition's
        store (the folder ``state/<operator>/<partition>``, plus ``/<store name>`` for an
        operator of several stores: the commit lists one id per store, in the order of
        the operator's metadata)."""
        where = self.files.folder
        match = re.fullmatch(r"(?:.*/)?state/(\d+)/(\d+)(?:/([^/]+))?", where)
        if not match:
            raise StateFileError(f"{where}: not a state partition folder (state/<op>/<part>)")
        store = 0
        if match[3] is not None:
            metadata = read_operator_metadata(self.objects, where.rsplit("/", 2)[0])
            names = [info.name for info in metadata.stores]
            if match[3] not in names:
                raise StateFileError(f"{metadata.source}: no state store {match[3]!r}")
            store = names.index(match[3])
        commit = f"commits/{version - 1}"
        try:
            text = self.objects.read_bytes(commit).decode("utf-8", "replace")
        except ObjectMissingError:
            raise StateFileError(
                f"{self.objects.where(commit)}: missing, so version {version} of {where} is "
                "not committed"
            ) from None
        try:
            ids = json.loads(text.split("\n", 1)[1])["stateUniqueIds"][match[1]]
            uid = ids[int(match[2])][store]
        except (IndexError, KeyError, TypeError, ValueError):
            raise StateFileError(
                f"{self.objects.where(commit)}: names no state file id for {where} "
                "(checkpoint format v2 needs one)"
            ) from None
        if not isinstance(uid, str) or not re.fullmatch(r"[0-9A-Za-z-]+", uid):
            raise StateFileError(f"{self.objects.where(commit)}: a bad state file id {uid!r}")
        return uid


# -- reading files -------------------------------------------------------------------------
def _read_checked(objects: ObjectStore, files: PartitionFiles, key: str) -> bytes:
    """The bytes of the zip or changelog ``key``, checked against the checksum files beside
    it: Hadoop's ``.<name>.crc`` and Spark's own ``<name>.crc`` (its size)."""
    where = objects.where(key)
    try:
        raw = objects.read_bytes(key)
    except ObjectMissingError:
        raise StateFileError(f"{where}: missing") from None
    name = key.rpartition("/")[2]
    if f".{name}.crc" in files.names:
        check_hadoop_crc(objects, f"{files.folder}/.{name}.crc", raw, where)
    if f"{name}.crc" in files.names:
        try:
            size = json.loads(objects.read_bytes(f"{key}.crc"))["mainFileSize"]
        except ObjectMissingError:
            size = len(raw)  # removed with its file since the listing: the file is checked
        except (KeyError, TypeError, ValueError):
            raise StateFileError(f"{where}: its checksum file {name}.crc is damaged") from None
        if size != len(raw):
            raise StateFileError(
                f"{where}: {len(raw)} bytes, but its checksum file says {size} (cut short or "
                "replaced)"
            )
    return raw


def _changelog_records(raw: bytes, where: str) -> tuple[memoryview, int]:
    """(the decompressed changelog, where its records start), the header checked."""
    data = memoryview(decompress_state_file(raw, where))
    version, start = _changelog_format(data)
    if version in (2, 4):
        raise UnsupportedStateError(f"{_COLUMN_FAMILIES} ({where})")
    if version not in (1, 3):
        raise StateFileError(f"{where}: changelog format v{version} is not known")
    return data, start


def _changelog_format(data: memoryview) -> tuple[int, int]:
    """(format version, offset after the version text). Quirk: format 1 writes no header,
    so Spark reads a ``writeUTF`` text anyway and takes anything that is not ``v<digits>``
    (the start of a record, or a text cut short) as format 1, and so does this."""
    if len(data) >= 2:
        (length,) = _UTF_LENGTH.unpack_from(data)
        text = bytes(data[2 : 2 + length])
        if len(text) == length and text[:1] == b"v" and text[1:].isdigit():
            version = int(text[1:])
            return (1, 0) if version == 1 else (version, 2 + length)
    return 1, 0


def _lineage(records: tuple[memoryview, int], where: str) -> list[tuple[int, str]]:
    """The (version, unique id) pairs a format-3 changelog's lineage text names."""
    data, start = records
    if start == 0:
        raise StateFileError(f"{where}: a changelog with a unique id but no lineage")
    try:
        (length,) = _UTF_LENGTH.unpack_from(data, start)
        items = json.loads(bytes(data[start + 2 : start + 2 + length]))
        return [(int(i["version"]), str(i["checkpointUniqueId"])) for i in items]
    except (struct.error, KeyError, TypeError, ValueError):
        raise StateFileError(f"{where}: damaged lineage") from None


def _apply(
    records: tuple[memoryview, int], state: dict[bytes, bytes], where: str, checksums: bool
) -> None:
    """Apply a changelog's records to ``state`` (the state of the version before it), in
    place. On ``StateFileError`` ``state`` may hold part of it: throw it away."""
    for key, value in _records(*records, where):
        if value is None:
            # With row checksums a delete's key carries the key's CRC32-C first.
            state.pop(_row(key[4:] if checksums else key, where, "key"), None)
        else:
            state[_row(key, where, "key")] = _value(value, where, checksums)


def _records(
    data: memoryview, start: int, where: str
) -> Iterator[tuple[memoryview, memoryview | None]]:
    """The (key, value or None for a delete) records of a changelog of format 1 or 3
    (``start``: after the version text of format 3, whose lineage text comes next), the
    framing checked to the last byte."""
    end = len(data)
    take = _INT32_BE.unpack_from
    try:
        position = start + 2 + _UTF_LENGTH.unpack_from(data, start)[0] if start else 0
        (key_size,) = take(data, position)
        while key_size != -1:
            if key_size < 0 or position + 8 + key_size > end:
                raise ValueError(f"bad key size {key_size} at byte {position}")
            key = data[position + 4 : position + 4 + key_size]
            position += 4 + key_size
            (value_size,) = take(data, position)
            position += 4
            if value_size == -1:
                yield key, None
            elif 0 <= value_size <= end - position:
                yield key, data[position : position + value_size]
                position += value_size
            else:
                raise ValueError(f"bad value size {value_size} at byte {position - 4}")
            (key_size,) = take(data, position)
        position += 4
    except (ValueError, struct.error) as exc:
        raise StateFileError(f"{where}: damaged records ({exc})") from None
    if position != end:
        raise StateFileError(f"{where}: {end - position} bytes after the last record")


def _row(encoded: memoryview | bytes, where: str, what: str) -> bytes:
    """The UnsafeRow in ``encoded`` (a key or value as Spark's RocksDB encoder wrote it)."""
    if not encoded or encoded[0] != _ENCODING_VERSION:
        first = f"byte {encoded[0]:#04x}" if encoded else "nothing"
        why = (
            "keys encoded for prefix or range scans are not supported yet"
            if what == "key"
            else "row checksums not expected (spark.sql.streaming.stateStore.rowChecksum.enabled)?"
        )
        raise StateFileError(
            f"{where}: a {what} starting with {first}, not Spark's UnsafeRow encoding "
            f"(version byte 0); {why}"
        )
    return bytes(encoded[1:])


def _value(encoded: memoryview | bytes, where: str, checksums: bool) -> bytes:
    """``_row`` of a value, after its row checksum header when ``checksums``."""
    if checksums:
        if len(encoded) < 8 or _INT32_LE.unpack_from(encoded, 4)[0] != len(encoded) - 8:
            raise StateFileError(
                f"{where}: a value without the row checksum header "
                "(spark.sql.streaming.stateStore.rowChecksum.enabled)"
            )
        encoded = encoded[8:]
    return _row(encoded, where, "value")


# -- snapshots -----------------------------------------------------------------------------
def _read_snapshot(
    objects: ObjectStore,
    files: PartitionFiles,
    version: int,
    uid: str,
    *,
    work_dir: str | os.PathLike[str],
    checksums: bool,
) -> dict[bytes, bytes]:
    """The keys and values of ``version``'s snapshot: its database restored in a folder of
    ``work_dir`` (removed after), then scanned."""
    key = files.key(version, _SNAPSHOT, uid)
    where = objects.where(key)
    entries, ssts = _unzip(_read_checked(objects, files, key), where)
    os.makedirs(work_dir, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f"rocksdb-{version}-", dir=work_dir)
    try:
        for name, data in entries.items():
            with open(os.path.join(folder, name), "xb") as out:
                out.write(data)
        sst_keys = {}
        for local, (dfs, size) in ssts.items():
            sst_key = f"{files.folder}/{_SST_FOLDER}/{dfs}"
            _place_sst(objects, sst_key, os.path.join(folder, local), size, where)
            sst_keys[local] = objects.where(sst_key)
        rows = _scan(folder, where, sst_keys)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {_row(k, where, "key"): _value(v, where, checksums) for k, v in rows}


def _unzip(raw: bytes, where: str) -> tuple[dict[str, bytes], dict[str, tuple[str, int]]]:
    """(the zip's RocksDB files by name, the SSTs its metadata lists: name in the database
    → (name under ``SSTs/``, size))."""
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
    header, _, body = entries.pop(_METADATA_ENTRY).partition(b"\n")
    if header.strip() != _METADATA_HEADER:
        raise StateFileError(
            f"{where}: snapshot metadata {header[:20]!r} is not supported yet (known: v1)"
        )
    try:
        metadata: dict[str, Any] = json.loads(body)
        ssts = {
            str(f["localFileName"]): (str(f["dfsSstFileName"]), int(f["sizeBytes"]))
            for f in metadata.get("sstFiles") or ()
        }
    except (KeyError, TypeError, ValueError):
        raise StateFileError(f"{where}: damaged snapshot metadata") from None
    if metadata.get("columnFamilyMapping"):
        raise UnsupportedStateError(f"{_COLUMN_FAMILIES} ({where})")
    for local, (dfs, _) in ssts.items():
        if not _SST_NAME.fullmatch(local) or not _PLAIN_NAME.fullmatch(dfs) or local in entries:
            raise StateFileError(f"{where}: its metadata lists a bad SST name ({local}, {dfs})")
    return entries, ssts


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
    error: it costs nothing when all is well."""
    for local, sst in sorted(sst_keys.items()):
        try:
            rocks.check_table_file(os.path.join(folder, local))
        except IqkitError:
            return sst
    return None
