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
names in the database) and scanning it read-only through ``partitions.rocks``
(``rocksdb_snapshots``).

Changelog records (after the decompression): format 1 has no header; it is records
``[key size: int32 BE][key][value size: int32 BE][value]``, a value size of -1 deletes the
key and a key size of -1 ends the file, exactly the default provider's framing. Format 3
is format 1 after two ``writeUTF`` texts (a 2-byte big-endian length, then the bytes):
``"v3"`` and the lineage, a JSON list of ``{"version", "checkpointUniqueId"}`` from the
newest snapshot to ``v - 1``. Format 2 is written for a store in several column families:
``writeUTF("v2")``, then records that each start with a type byte: 0x01 a put
(``[key size][key][value size][value]``), 0x10 a delete (``[key size][key][-1]``), 0x11
a merge (a list state's append: transformWithState), 0x00 the end. Format 4 is format 2
after format 3's lineage text (column families with checkpoint format v2).

Keys and values in the database and in changelogs are Spark's encoding of an UnsafeRow:
one version byte (0), then the row. With
``spark.sql.streaming.stateStore.rowChecksum.enabled`` a value is ``[CRC32-C: int32
LE][length of the rest: int32 LE]`` and then the encoded row, and a changelog's delete
record has the key's CRC32-C (4 bytes) before the key; ``row_checksums=True`` strips both
(not recomputed: the lz4 and RocksDB block checksums, and Hadoop's, cover the same
bytes, and CRC32-C has no fast implementation in Python's standard library).

A store opened for prefix scans (its operator's metadata records ``numColsPrefixKey``
above 0: a session window's) has its keys encoded as two rows: ``[size of the first:
int32, the machine's order (little-endian)][0][UnsafeRow of the prefix columns][0]
[UnsafeRow of the other columns]``, the second running to the key's end; values are
encoded as any. Such keys are kept whole, each checked (``PrefixKeyDecoder`` decodes it
into the one key row Spark's decoder joins). Keys encoded for range scans are refused in
one line.

Column families (transformWithState, join state formats 3 and 4): Spark keeps every
family in RocksDB's one physical family, each key led by its family's 2-byte id (little
endian), before the version byte; the snapshot's metadata maps names to ids
(``columnFamilyMapping``), and the changelogs are of format 2 or 4. A merge record
appends its value to the key's, as RocksDB's string-append operator does (a list
state's element), with a delimiter that depends on Spark's merge operator version.
Only ``load_family_state`` reads such a store: keys and values as stored, the 2-byte id
first in each key (``split_families`` groups them by family, the id taken off), since a
family's keys and values are encoded as the family's own reader knows (prefix-scan keys,
lists, Avro); ``load_state`` refuses one in one line, never giving keys it would take for
rows. ``KeyForm`` says how a plain store's keys are laid out.

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

import json
import operator
import os
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import compress
from typing import Any

from ...errors import ObjectMissingError
from ..objects import ObjectStore
from . import rocksdb_changelogs, rocksdb_snapshots
from .codecs import StateFileError, UnknownFormatError
from .hdfs_files import check_hadoop_crc
from .shape import UnsupportedStateError
from .state_records import StateRecords
from .state_schema import read_operator_metadata
from .unsafe_row import RowDecoder

__all__ = [
    "PLAIN_KEYS",
    "FamilyState",
    "KeyForm",
    "PartitionFiles",
    "PrefixKeyDecoder",
    "ReplayPlan",
    "changelog_changes",
    "StateFileError",
    "list_files",
    "list_versions",
    "load_family_state",
    "load_records",
    "load_state",
    "oldest_version",
    "plan_replay",
    "split_families",
    "stored_row",
]

#: ``<version>.zip`` / ``<version>.changelog``, with ``_<unique id>`` in format v2.
_STATE_FILE = re.compile(r"(\d+)(?:_([0-9A-Za-z-]+))?\.(zip|changelog)")
_SNAPSHOT, _CHANGELOG = "zip", "changelog"
_INT32_LE = struct.Struct("<i")
#: The first byte of every key and value Spark's RocksDB encoder writes (its version).
_ENCODING_VERSION = 0
#: The commit log's header lines: v1 (every line), v2 (checkpoint format v2's state ids).
_COMMIT_LOG_VERSIONS = ("v1", "v2")
_SST_FOLDER = "SSTs"
#: A column family id before a key (``columnFamilyMapping``): 2 bytes, little-endian.
_FAMILY_ID = struct.Struct("<H")
#: A key's family id bytes, and the key after them (``split_families``).
_ID_OF = operator.itemgetter(slice(0, _FAMILY_ID.size))
_AFTER_ID = operator.itemgetter(slice(_FAMILY_ID.size, None))
_DELETE, _MERGE = rocksdb_changelogs.DELETE, rocksdb_changelogs.MERGE
_DEFAULT_DELIMITER = rocksdb_snapshots.DEFAULT_DELIMITER


@dataclass(frozen=True)
class KeyForm:
    """How a plain store's keys are laid out in its RocksDB files (module docstring):
    what a reader must check before the row, chosen once per store. (A store in column
    families is read by ``load_family_state``: its families' keys differ.)"""

    #: Each key is two rows, the prefix columns' and the others' (a session window's).
    prefix_scan: bool = False


#: The keys of most stores: one row each.
PLAIN_KEYS = KeyForm()


@dataclass(frozen=True)
class FamilyState:
    """A version of a store in column families: ``families``, each family's id by name
    (the snapshots' ``columnFamilyMapping``), and ``rows``, every live key and value as
    stored (the key's 2-byte family id first; both still in their family's encoding:
    ``split_families`` groups them)."""

    families: Mapping[str, int]
    rows: dict[bytes, bytes]


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
    key_form: KeyForm = PLAIN_KEYS,
) -> dict[bytes, bytes]:
    """The live keys of ``partition_dir`` at state ``version``, key UnsafeRow bytes →
    value UnsafeRow bytes (Spark's encoding prefix removed): the newest snapshot at or
    below it plus the changelogs after it. Version 0 is the empty state before the first
    batch. ``work_dir`` is a private scratch folder (created if missing) where a snapshot's
    database is restored while it is read, then removed; nothing is ever written into the
    checkpoint. ``files`` is a listing already made (``list_files``), ``plan`` a plan
    already made (``plan_replay``). ``key_form``: how the store's keys are laid out
    (``KeyForm``). ``StateFileError`` when a file needed is missing, cut short or damaged;
    ``UnsupportedStateError`` for a store this module cannot read yet (one line naming
    what: a store in column families is ``load_family_state``'s)."""
    if plan is None or plan.version != version:
        plan = plan_replay(objects, partition_dir, version, files=files)
    return _replay(objects, plan, work_dir, _PlainRecords(key_form, row_checksums))[0]


def load_records(
    objects: ObjectStore,
    partition_dir: str,
    version: int,
    *,
    work_dir: str | os.PathLike[str],
    plan: ReplayPlan | None = None,
    key_form: KeyForm = PLAIN_KEYS,
) -> StateRecords | None:
    """``load_state`` held column-wise (``state_records``): the snapshot's live rows, then
    every changelog's records framed in bulk, in replay order (``StateRecords.live`` keeps
    the ones ``load_state`` keeps), with no Python object per changelog record. ``None``
    where only ``load_state`` reads the version: keys laid out for prefix scans, and a
    changelog ``rocksdb_changelogs.framed_records`` does not frame in bulk."""
    if key_form.prefix_scan:
        return None
    if plan is None or plan.version != version:
        plan = plan_replay(objects, partition_dir, version)
    files, records = plan.files, _PlainRecords(key_form, False)
    parts: list[StateRecords] = []
    if plan.base is not None:
        base, uid = plan.base
        where = objects.where(files.key(base, _SNAPSHOT, uid))
        rows, families = _snapshot_rows(objects, files, base, uid, work_dir=work_dir)
        parts.append(StateRecords.of_mapping(records.snapshot(rows, families, where)))
    for changelog, uid in plan.changelogs:
        key = files.key(changelog, _CHANGELOG, uid)
        framed = rocksdb_changelogs.framed_records(
            *_changelog(objects, plan, key), objects.where(key)
        )
        if framed is None:
            return None
        parts.append(framed)
    return StateRecords.concat(parts)


def load_family_state(
    objects: ObjectStore,
    partition_dir: str,
    version: int,
    *,
    work_dir: str | os.PathLike[str],
    merge_delimiter: bytes = _DEFAULT_DELIMITER,
    row_checksums: bool = False,
    files: PartitionFiles | None = None,
    plan: ReplayPlan | None = None,
) -> FamilyState:
    """``load_state`` for a store in column families (transformWithState, a join of state
    format 3): the newest snapshot at or below ``version`` plus the changelogs after it,
    their records typed (put, delete, merge). A merge appends its value to the key's
    (RocksDB's string-append operator, ``merge_delimiter`` between: ``b","`` for Spark's
    merge operator version 1, ``b""`` for version 2). Keys and values are kept as stored.
    The family ids come from the snapshot's metadata; a version whose keys have ids its
    snapshot does not name (or that has no snapshot) takes them from the partition's other
    snapshots (Spark keeps a family's id for the store's life and never gives one id to two
    families). Row checksums are refused in one line. ``StateFileError`` as
    ``load_state``."""
    if row_checksums:
        raise UnsupportedStateError(
            f"not supported yet: column families (transformWithState, join state format 3) "
            f"with row checksums ({objects.where(partition_dir)})"
        )
    if plan is None or plan.version != version:
        plan = plan_replay(objects, partition_dir, version, files=files)
    state, families = _replay(objects, plan, work_dir, _FamilyRecords(merge_delimiter))
    known = {_FAMILY_ID.pack(cf) for cf in families.values()}
    if not set(map(_ID_OF, state)) <= known:
        families = {**_all_snapshot_families(objects, plan.files), **families}
    return FamilyState(families, state)


def split_families(
    rows: Mapping[bytes, bytes], families: Mapping[str, int], where: str
) -> dict[str, dict[bytes, bytes]]:
    """``rows`` (keys with a 2-byte little-endian family id first) by family name, the id
    taken off each key; every family of ``families`` is there, empty when it has no key.
    A key of an id no family has is ``StateFileError`` naming ``where``."""
    names = {_FAMILY_ID.pack(cf): name for name, cf in families.items()}
    out: dict[str, dict[bytes, bytes]] = {name: {} for name in families}
    # Each key's id by C-level iterators, no Python call per key: a variable's family
    # holds millions of keys (a key shorter than an id has a shorter "id", never known).
    keys = list(rows)
    ids = list(map(_ID_OF, keys))
    present = set(ids)
    unknown = present.difference(names)
    if unknown:
        raise StateFileError(
            f"{where}: a key of column family id {min(unknown).hex() or 'none'}, which no "
            "snapshot's metadata names"
        )
    values = list(rows.values())
    for cf in present:
        kept = list(map(cf.__eq__, ids)) if len(present) > 1 else None
        family_keys = keys if kept is None else compress(keys, kept)
        family_values = values if kept is None else compress(values, kept)
        out[names[cf]] = dict(zip(map(_AFTER_ID, family_keys), family_values, strict=True))
    return out


def changelog_changes(
    objects: ObjectStore,
    plan: ReplayPlan,
    keys: list[str],
    *,
    row_checksums: bool = False,
    key_form: KeyForm = PLAIN_KEYS,
) -> dict[bytes, bytes | None]:
    """What the changelogs ``keys`` (files of ``plan``, in replay order) change: key
    UnsafeRow bytes → the value after them, or ``None`` where they delete the key. For a
    version built on an older one's state, of a plain store (a store in column families
    is refused: a merge needs the value before it); ``StateFileError`` as
    ``load_state``."""
    changes: dict[bytes, bytes | None] = {}
    records = _PlainRecords(key_form, row_checksums)
    for key in keys:
        where = objects.where(key)
        for record_key, value in records.changes(_changelog(objects, plan, key), where):
            changes[record_key] = value
    return changes


# -- replaying a version -------------------------------------------------------------------
def _replay(
    objects: ObjectStore,
    plan: ReplayPlan,
    work_dir: str | os.PathLike[str],
    records: _PlainRecords | _FamilyRecords,
) -> tuple[dict[bytes, bytes], dict[str, int]]:
    """(the live keys and values of ``plan``'s version as ``records`` keeps them, the
    column families its snapshot names): the snapshot, then each changelog applied."""
    files = plan.files
    state: dict[bytes, bytes] = {}
    families: dict[str, int] = {}
    if plan.base is not None:
        version, uid = plan.base
        where = objects.where(files.key(version, _SNAPSHOT, uid))
        rows, families = _snapshot_rows(
            objects, files, version, uid, work_dir=work_dir, merge_delimiter=records.delimiter
        )
        state = records.snapshot(rows, families, where)
    for changelog, uid in plan.changelogs:
        key = files.key(changelog, _CHANGELOG, uid)
        records.apply(_changelog(objects, plan, key), state, objects.where(key))
    return state, families


def _changelog(objects: ObjectStore, plan: ReplayPlan, key: str) -> tuple[memoryview, int]:
    """The records of the changelog ``key`` of ``plan`` (read while planning, else now)."""
    records = plan.records.get(key)
    if records is None:
        records = rocksdb_changelogs.records_of(
            _read_checked(objects, plan.files, key), objects.where(key)
        )
    return records


class _PlainRecords:
    """How a plain store's records are kept: keys as ``_key`` gives them, values their
    UnsafeRow (row checksums stripped); column families refused."""

    delimiter = _DEFAULT_DELIMITER  # a plain store has no merges

    def __init__(self, key_form: KeyForm, checksums: bool) -> None:
        self.key_form = key_form
        self.checksums = checksums

    def snapshot(
        self, rows: list[tuple[bytes, bytes]], families: Mapping[str, int], where: str
    ) -> dict[bytes, bytes]:
        if families:
            raise UnsupportedStateError(f"{rocksdb_changelogs.COLUMN_FAMILIES} ({where})")
        form, checksums = self.key_form, self.checksums
        return {_key(k, where, form): _value(v, where, checksums) for k, v in rows}

    def changes(
        self, records: tuple[memoryview, int], where: str
    ) -> Iterator[tuple[bytes, bytes | None]]:
        """(key, value after the record, or ``None`` for a delete), in order."""
        for kind, key, value in rocksdb_changelogs.records(*records, where, families=False):
            if kind == _DELETE:
                # With row checksums a delete's key carries the key's CRC32-C first.
                yield _key(key[4:] if self.checksums else key, where, self.key_form), None
            else:
                yield _key(key, where, self.key_form), _value(value, where, self.checksums)

    def apply(self, records: tuple[memoryview, int], state: dict[bytes, bytes], where: str) -> None:
        """Apply a changelog's records to ``state`` (the state of the version before it),
        in place. On ``StateFileError`` ``state`` may hold part of it: throw it away."""
        for key, value in self.changes(records, where):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value


class _FamilyRecords:
    """How a store in column families' records are kept: as stored, merges appended."""

    def __init__(self, delimiter: bytes) -> None:
        self.delimiter = delimiter

    def snapshot(
        self, rows: list[tuple[bytes, bytes]], families: Mapping[str, int], where: str
    ) -> dict[bytes, bytes]:
        return dict(rows)

    def apply(self, records: tuple[memoryview, int], state: dict[bytes, bytes], where: str) -> None:
        """As ``_PlainRecords.apply``; a merge appends to the key's value (RocksDB's
        string-append operator), or puts it where the key has none."""
        for kind, key, value in rocksdb_changelogs.records(*records, where, families=True):
            key = bytes(key)
            if kind == _DELETE:
                state.pop(key, None)
            elif kind == _MERGE and key in state:
                state[key] = state[key] + self.delimiter + bytes(value)  # type: ignore[arg-type]
            else:
                state[key] = bytes(value)  # type: ignore[arg-type]


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
        self.records[key] = records = rocksdb_changelogs.records_of(
            _read_checked(self.objects, files, key), where
        )
        # Spark's own order: the lineage (newest snapshot to version - 1) and the version
        # itself; the newest of them whose snapshot is there is the base.
        lineage = sorted([*rocksdb_changelogs.lineage(records, where), (version, uid)])
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
        store (the folder ``state/<operator>/<partition>``, or its subfolder
        ``<store name>`` for an operator of several stores: a join's four). The commit
        lists one id per store, in the order the operator's metadata lists its stores."""
        where = self.files.folder
        match = re.fullmatch(r"(?:.*/)?(state/(\d+))/(\d+)(?:/([^/]+))?", where)
        if not match:
            raise UnsupportedStateError(
                f"not supported yet: checkpoint format v2 (state files named <version>_<id>) "
                f"in a folder {where!r}"
            )
        store = 0
        if match[4] is not None:
            names = [i.name for i in read_operator_metadata(self.objects, match[1]).stores]
            if match[4] not in names:
                raise StateFileError(
                    f"{self.objects.where(where)}: a store the operator's metadata does not "
                    f"list ({', '.join(names)})"
                )
            store = names.index(match[4])
        commit = f"commits/{version - 1}"
        try:
            text = self.objects.read_bytes(commit).decode("utf-8", "replace")
        except ObjectMissingError:
            raise StateFileError(
                f"{self.objects.where(commit)}: missing, so version {version} of {where} is "
                "not committed"
            ) from None
        header = text.split("\n", 1)[0].strip()
        if header not in _COMMIT_LOG_VERSIONS:
            newer = re.fullmatch(r"v[0-9]{1,9}", header)  # else a damaged header
            raise (UnknownFormatError if newer else StateFileError)(
                f"{self.objects.where(commit)}: commit log format "
                f"{header if newer else repr(header[:20])} is not "
                f"supported yet (known: {', '.join(_COMMIT_LOG_VERSIONS)})"
            )
        try:
            ids = json.loads(text.split("\n", 1)[1])["stateUniqueIds"][match[2]]
            uid = ids[int(match[3])][store]
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


def _key(encoded: memoryview | bytes, where: str, form: KeyForm) -> bytes:
    """A key as ``load_state`` gives it: its row (``stored_row``), or for
    ``form.prefix_scan`` the whole key, its two rows' framing checked (module
    docstring)."""
    if not form.prefix_scan:
        return stored_row(encoded, where, "key")
    size = len(encoded)
    if size < 6:  # the prefix size, and a version byte before each row
        raise StateFileError(f"{where}: a prefix-scan key of {size} bytes is too short")
    (prefix,) = _INT32_LE.unpack_from(encoded)
    if not 0 < prefix < size - 4:
        raise StateFileError(
            f"{where}: a prefix-scan key whose prefix size {prefix} runs past its {size} bytes"
        )
    if encoded[4] != _ENCODING_VERSION or encoded[4 + prefix] != _ENCODING_VERSION:
        raise StateFileError(
            f"{where}: a prefix-scan key whose rows do not start with Spark's UnsafeRow "
            "version byte 0"
        )
    return bytes(encoded)


def stored_row(encoded: memoryview | bytes, where: str, what: str = "key") -> bytes:
    """The UnsafeRow in ``encoded`` (a key or value as Spark's RocksDB encoder wrote it:
    a version byte 0, then the row); a column family's row too (``split_families``)."""
    if not encoded or encoded[0] != _ENCODING_VERSION:
        first = f"byte {encoded[0]:#04x}" if encoded else "nothing"
        why = (
            "a key encoded for prefix or range scans, in a store whose metadata records no "
            "prefix columns?"
            if what == "key"
            else "row checksums not expected (spark.sql.streaming.stateStore.rowChecksum.enabled)?"
        )
        raise StateFileError(
            f"{where}: a {what} starting with {first}, not Spark's UnsafeRow encoding "
            f"(version byte 0); {why}"
        )
    return bytes(encoded[1:])


class PrefixKeyDecoder(RowDecoder):
    """Decodes keys of a store opened for prefix scans, as ``_key`` keeps them: the row of
    the first ``prefix_columns`` key columns and the row of the others, as one key row
    (what Spark's decoder joins them into). ``decode_columns`` gives ``None`` (the row
    path)."""

    def __init__(self, key_schema: Mapping[str, Any], prefix_columns: int) -> None:
        super().__init__(key_schema)
        fields = list(key_schema["fields"])
        self._prefix = RowDecoder({"type": "struct", "fields": fields[:prefix_columns]})
        self._rest = RowDecoder({"type": "struct", "fields": fields[prefix_columns:]})
        self.kinds = None

    def decode(self, data: bytes) -> tuple[Any, ...]:
        (prefix,) = _INT32_LE.unpack_from(data)
        return self._prefix.decode(data[5 : 4 + prefix]) + self._rest.decode(data[5 + prefix :])


def _value(encoded: memoryview | bytes, where: str, checksums: bool) -> bytes:
    """``_row`` of a value, after its row checksum header when ``checksums``."""
    if checksums:
        if len(encoded) < 8 or _INT32_LE.unpack_from(encoded, 4)[0] != len(encoded) - 8:
            raise StateFileError(
                f"{where}: a value without the row checksum header "
                "(spark.sql.streaming.stateStore.rowChecksum.enabled)"
            )
        encoded = encoded[8:]
    return stored_row(encoded, where, "value")


# -- snapshots -----------------------------------------------------------------------------
def _snapshot_rows(
    objects: ObjectStore,
    files: PartitionFiles,
    version: int,
    uid: str,
    *,
    work_dir: str | os.PathLike[str],
    merge_delimiter: bytes = _DEFAULT_DELIMITER,
) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
    """(every key and value of ``version``'s snapshot as stored, its metadata's column
    families): the zip read and checked, its database restored (``rocksdb_snapshots``)."""
    key = files.key(version, _SNAPSHOT, uid)
    where = objects.where(key)
    raw = _read_checked(objects, files, key)
    return rocksdb_snapshots.restore(
        objects, raw, where, f"{files.folder}/{_SST_FOLDER}", version=version,
        work_dir=work_dir, merge_delimiter=merge_delimiter,
    )  # fmt: skip


def _all_snapshot_families(objects: ObjectStore, files: PartitionFiles) -> dict[str, int]:
    """The column families every snapshot of ``files`` names, the newest's last (only
    their zips are read, no database restored)."""
    families: dict[str, int] = {}
    for version in sorted(files.snapshots):
        for uid in sorted(files.snapshots[version]):
            key = files.key(version, _SNAPSHOT, uid)
            raw = _read_checked(objects, files, key)
            families.update(rocksdb_snapshots.families_of(raw, objects.where(key)))
    return families
