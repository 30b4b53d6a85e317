"""The files of Spark's default state store provider (``HDFSBackedStateStoreProvider``) for
one partition of one store, replayed into the live keys and values of a version.

Why here: iqkit reads a checkpoint's state without Spark, so it reads these files itself.

The partition's folder is ``state/<operator id>/<partition>`` for the store named
"default", and ``state/<operator id>/<partition>/<store name>`` for any other store (a
stream-stream join's four stores, for instance). In it, for each state version ``v`` (the
state after batch ``v - 1``):

- ``<v>.delta``: the changes batch ``v - 1`` made;
- ``<v>.snapshot``: every live key at ``v``, written now and then by the maintenance task.

Both are streams of Spark's state codec (lz4 by default; lzf, snappy or zstd: ``codecs``
undoes each) of records ``[key size: int32 BE][key][value size: int32 BE][value]``; a
value size of -1 removes the key (deltas only) and a key size of -1 ends the records.
Keys and values are UnsafeRow bytes (``unsafe_row.RowDecoder`` decodes them).

Version ``v`` is the newest snapshot at or below ``v`` plus each delta after it, in order
(a version with both files is read from its snapshot, as Spark does). ``load_state`` gives
it as a dict; ``load_records`` gives the files' records column-wise, in replay order
(``state_records``), for decoding in bulk. Every byte read is checked: where Hadoop
wrote one (its local file system does; object stores get none), against the
``.<name>.crc`` file beside a state file (CRC-32 of each 512-byte chunk, by default);
then as far as its codec allows (lz4: each block's checksum and the stream's end mark;
lzf, snappy and Spark's zstd carry no checksum: ``codecs``); then the record framing, to
the end record. Anything found wrong, a file missing, cut short or damaged, raises
``StateFileError`` naming the file: never rows from it.

With ``spark.sql.streaming.stateStore.rowChecksum.enabled`` Spark puts a 4-byte CRC32-C
before each value, and before a removed key; ``row_checksums=True`` strips it. It is not
recomputed: the lz4 block checksums (and Hadoop's) already cover the same bytes, and
CRC32-C has no fast implementation in Python's standard library.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ...errors import ObjectMissingError
from ..objects import ObjectStore
from .codecs import StateFileError, decompress_state_file
from .state_records import StateRecords

__all__ = [
    "PartitionFiles",
    "StateFileError",
    "apply_delta",
    "frame_records",
    "check_hadoop_crc",
    "delta_records",
    "delta_version",
    "list_files",
    "list_versions",
    "load_records",
    "load_state",
    "read_snapshot",
]


_STATE_FILE = re.compile(r"(\d+)\.(delta|snapshot)")
_INT32_BE = struct.Struct(">i")
_HADOOP_CRC_MAGIC = b"crc\x00"


@dataclass(frozen=True)
class PartitionFiles:
    """The state files in one partition's folder: which versions have a delta and which a
    snapshot, and which of their Hadoop ``.crc`` files exist."""

    folder: str
    deltas: frozenset[int]
    snapshots: frozenset[int]
    crc_files: frozenset[str]
    #: The folder as a user would write it (``ObjectStore.where``), for messages.
    location: str = ""

    def versions(self) -> list[int]:
        """Every version that has a delta or a snapshot, ascending."""
        return sorted(self.deltas | self.snapshots)

    def replay_plan(self, version: int) -> tuple[int, list[int]]:
        """(snapshot version or 0 for none, the delta versions to apply after it, in
        order) that rebuild ``version``; ``StateFileError`` naming the first delta the
        plan needs that is not there (Spark's retention removes old deltas, but never
        any a retained version needs)."""
        base = max((s for s in self.snapshots if s <= version), default=0)
        needed = list(range(base + 1, version + 1))
        for delta in needed:
            if delta not in self.deltas:
                raise StateFileError(
                    f"{self.location or self.folder}/{delta}.delta: missing, and version "
                    f"{version} of the state needs it (newest snapshot at or below it: "
                    f"{base or 'none'})"
                )
        return base, needed

    def key(self, version: int, kind: str) -> str:
        """The key of ``version``'s ``kind`` ("delta" or "snapshot") file."""
        return f"{self.folder}/{version}.{kind}"


def list_files(objects: ObjectStore, partition_dir: str) -> PartitionFiles:
    """The state files directly in ``partition_dir`` (a key relative to the checkpoint
    root, e.g. ``state/0/3``): one listing. Sub-folders (``_metadata``, other stores) and
    Spark's temporary files (names starting with a dot) are not state files."""
    folder = partition_dir.strip("/")
    deltas: set[int] = set()
    snapshots: set[int] = set()
    crc_files: set[str] = set()
    for key in objects.list(folder):
        parent, _, name = key.rpartition("/")
        if parent != folder:
            continue
        if name.startswith(".") and name.endswith(".crc"):
            crc_files.add(name)
            continue
        match = _STATE_FILE.fullmatch(name)
        if match:
            (deltas if match[2] == "delta" else snapshots).add(int(match[1]))
    return PartitionFiles(
        folder, frozenset(deltas), frozenset(snapshots), frozenset(crc_files), objects.where(folder)
    )


def list_versions(objects: ObjectStore, partition_dir: str) -> list[int]:
    """The versions of ``partition_dir`` that have a ``.delta`` or a ``.snapshot`` file,
    ascending. Each can be rebuilt unless files were lost (``load_state`` then names the
    missing one); whether its batch was committed is the commit log's to say."""
    return list_files(objects, partition_dir).versions()


def load_state(
    objects: ObjectStore,
    partition_dir: str,
    version: int,
    *,
    row_checksums: bool = False,
    files: PartitionFiles | None = None,
) -> dict[bytes, bytes]:
    """The live keys of ``partition_dir`` at state ``version``, key UnsafeRow bytes →
    value UnsafeRow bytes: the newest snapshot at or below it plus the deltas after it.
    Version 0 is the empty state before the first batch. ``files`` is a listing already
    made (``list_files``), to spare a second one. ``StateFileError`` when a file needed is
    missing, cut short or damaged; ``StoreIOError``, as everywhere in iqkit, when the
    storage cannot be read at all (no credentials, endpoint down)."""
    records = load_records(
        objects, partition_dir, version, row_checksums=row_checksums, files=files
    )
    return records.to_dict()


def load_records(
    objects: ObjectStore,
    partition_dir: str,
    version: int,
    *,
    row_checksums: bool = False,
    files: PartitionFiles | None = None,
) -> StateRecords:
    """``load_state`` held column-wise (``state_records``), with no Python object per
    record: every record of the files, in replay order (``StateRecords.live`` keeps the
    ones ``load_state`` keeps)."""
    if version < 0:
        raise ValueError(f"no state version {version}: versions start at 0")
    if version == 0:
        return StateRecords.of_mapping({})
    files = files if files is not None else list_files(objects, partition_dir)
    base, deltas = files.replay_plan(version)
    keys = [(files.key(base, "snapshot"), False)] if base else []
    keys += [(files.key(delta, "delta"), True) for delta in deltas]
    framed = [
        _frame(key, _read_records(objects, files, key), row_checksums, removals=removals)
        for key, removals in keys
    ]
    return _replay(framed)


def delta_version(key: str) -> int | None:
    """The version whose delta file ``key`` is (``None``: not a delta file's key)."""
    match = _STATE_FILE.fullmatch(key.rpartition("/")[2])
    return int(match[1]) if match and match[2] == "delta" else None


def delta_records(
    objects: ObjectStore, files: PartitionFiles, versions: list[int], *, row_checksums: bool = False
) -> StateRecords:
    """Every record of the delta files of ``versions``, in replay order, removals marked:
    what those batches changed, to apply on top of the state before the first of them."""
    keys = [files.key(version, "delta") for version in versions]
    return _replay(
        [_frame(key, _read_records(objects, files, key), row_checksums, removals=True)
         for key in keys]
    )  # fmt: skip


def read_snapshot(
    objects: ObjectStore, files: PartitionFiles, version: int, *, row_checksums: bool = False
) -> dict[bytes, bytes]:
    """The keys and values of ``version``'s snapshot file."""
    key = files.key(version, "snapshot")
    framed = _frame(key, _read_records(objects, files, key), row_checksums, removals=False)
    return _replay([framed]).to_dict()


def apply_delta(
    objects: ObjectStore,
    files: PartitionFiles,
    version: int,
    state: dict[bytes, bytes],
    *,
    row_checksums: bool = False,
) -> None:
    """Apply ``version``'s delta file to ``state`` (the state at ``version - 1``), in
    place: its puts replace values, its removals drop keys. On ``StateFileError``
    ``state`` is unchanged (every record is framed before any is applied)."""
    key = files.key(version, "delta")
    records = _replay(
        [_frame(key, _read_records(objects, files, key), row_checksums, removals=True)]
    )
    removed = records.removed if records.removed is not None else np.zeros(len(records), bool)
    for (record_key, value), removal in zip(records.items(), removed.tolist(), strict=True):
        if removal:
            state.pop(record_key, None)
        else:
            state[record_key] = value


def _read_records(objects: ObjectStore, files: PartitionFiles, key: str) -> bytes:
    """The decompressed record bytes of the state file ``key``, every checksum verified."""
    try:
        raw = objects.read_bytes(key)
    except ObjectMissingError:
        raise StateFileError(f"{objects.where(key)}: missing") from None
    folder, _, name = key.rpartition("/")
    crc_name = f".{name}.crc"
    if crc_name in files.crc_files:
        check_hadoop_crc(objects, f"{folder}/{crc_name}", raw, objects.where(key))
    return decompress_state_file(raw, objects.where(key))


def check_hadoop_crc(objects: ObjectStore, crc_key: str, raw: bytes, where: str) -> None:
    """Check ``raw`` against Hadoop's checksum file ``crc_key``: ``"crc\\0"``, the chunk
    size (int32 BE), then the CRC-32 (uint32 BE) of each chunk."""
    try:
        crc = objects.read_bytes(crc_key)
    except ObjectMissingError:
        return  # removed between the listing and now, with its file: the file is checked below
    if len(crc) < 8 or crc[:4] != _HADOOP_CRC_MAGIC:
        raise StateFileError(f"{where}: its checksum file {crc_key} is not a Hadoop .crc file")
    (chunk,) = _INT32_BE.unpack_from(crc, 4)
    count = -(-len(raw) // chunk) if chunk > 0 else -1
    if count < 0 or len(crc) != 8 + 4 * count:
        raise StateFileError(
            f"{where}: {len(raw)} bytes, but its checksum file was written for a file of "
            "another size (cut short or extended)"
        )
    expected = struct.unpack_from(f">{count}I", crc, 8)
    for index, want in enumerate(expected):
        if zlib.crc32(raw[index * chunk : (index + 1) * chunk]) != want:
            raise StateFileError(
                f"{where}: bytes {index * chunk}-{min(len(raw), (index + 1) * chunk) - 1} "
                "do not match its Hadoop checksum file (damaged)"
            )


@dataclass(frozen=True, eq=False)  # numpy arrays: identity, not ==
class _Framed:
    """The records of one state file, in file order: where each key and value lies in
    ``records`` (``int64`` arrays), and which records remove their key."""

    records: bytes
    key_starts: np.ndarray
    key_lengths: np.ndarray
    value_starts: np.ndarray
    value_lengths: np.ndarray
    removed: np.ndarray


#: Records a first look ahead checks for the same sizes (``_frame``), and the most.
_FIRST_LOOK = 16
_LONGEST_LOOK = 1 << 20
#: Records framed one by one after a look ahead that found fewer than this many alike.
_SHORT_RUN = 8
_MOST_SKIPPED = 256


def frame_records(where: str, records: bytes) -> StateRecords:
    """The records of ``records`` framed as a delta file's are (``[key size: int32 BE]
    [key][value size: int32 BE][value]``, a value size of -1 a removal, a key size of -1
    the end, nothing after it), column-wise, every size checked, values whole: the framing
    a RocksDB changelog of formats 1 and 3 shares with delta files (``rocksdb_changelogs``).
    ``StateFileError`` naming ``where`` for anything out of place."""
    framed = _frame(where, records, False, removals=True, whole_words=False)
    removed = framed.removed
    return StateRecords(
        framed.records, framed.key_starts, framed.key_lengths, framed.value_starts,
        framed.value_lengths, removed if removed.any() else None,
    )  # fmt: skip


def _frame(
    where: str, records: bytes, row_checksums: bool, *, removals: bool, whole_words: bool = True
) -> _Framed:
    """Find the records of one state file (the framing in the module docstring), every
    size checked; ``StateFileError`` naming ``where`` for anything out of place.

    Records are framed one after another (each one's sizes say where the next starts),
    but most files are long runs of records of the same key and value sizes (state keys
    and values of fixed-width columns; UnsafeRows come in 8-byte words): after each
    record framed in Python, numpy reads the size fields where the next records of the
    same sizes would start, and takes the leading ones that match. Each record taken
    so is framed exactly as it would be alone (its key size and value size fields read
    and equal to the checked ones, and it lies inside the file), so the records found
    are the same; where runs are short, look-aheads back off and records are framed
    one by one."""
    unpack_size = _INT32_BE.unpack_from
    end = len(records)
    prefix = 4 if row_checksums else 0
    runs: list[tuple[int, int, int, int]] = []  # start, records, key size, value size
    position = 0
    look, skip, skipped = _FIRST_LOOK, 0, 0
    try:
        while True:
            (key_size,) = unpack_size(records, position)
            if key_size == -1:
                position += 4
                break
            if key_size < 0 or position + 4 + key_size > end:
                raise ValueError(f"bad key size {key_size} at byte {position}")
            value_at = position + 4 + key_size
            (value_size,) = unpack_size(records, value_at)
            if value_size == -1 and removals:
                length = 8 + key_size
            elif value_size < prefix or value_at + 4 + value_size > end:
                raise ValueError(f"bad value size {value_size} at byte {value_at}")
            else:
                length = 8 + key_size + value_size
            count = 1
            if skip:
                skip -= 1
            elif (more := min(look, (end - position) // length - 1)) > 0:
                first = position + length
                keys = np.ndarray((more,), ">i4", records, first, (length,))
                values = np.ndarray((more,), ">i4", records, first + 4 + key_size, (length,))
                differ = (keys != key_size) | (values != value_size)
                same = int(differ.argmax()) if differ.any() else more
                count += same
                if same == more:
                    look, skipped = min(look * 4, _LONGEST_LOOK), 0
                elif same < _SHORT_RUN:
                    look, skipped = _FIRST_LOOK, min(max(skipped * 2, _SHORT_RUN), _MOST_SKIPPED)
                    skip = skipped
            runs.append((position, count, key_size, value_size))
            position += count * length
    except (ValueError, struct.error) as exc:
        raise StateFileError(f"{where}: damaged records ({exc})") from None
    if position != end:
        raise StateFileError(f"{where}: {end - position} bytes after the last record")
    runs_array = np.array(runs, dtype=np.int64).reshape(-1, 4)
    return _records_of_runs(records, runs_array, prefix, whole_words)


def _records_of_runs(records: bytes, runs: np.ndarray, prefix: int, whole_words: bool) -> _Framed:
    """Every record of ``runs`` (rows of: first record's start, records, key size, value
    size), where its key and value lie. A removal's key, and a value, start after the
    row checksum (``prefix`` bytes) when there is one; a value is its whole 8-byte words
    (Spark before 2.3 appended 4 stray bytes to some values, and Spark itself reads only
    whole words of a value); every byte of it where not ``whole_words``."""
    starts, counts, key_sizes, value_sizes = runs.T
    total = int(counts.sum())
    first_of_run = np.cumsum(counts) - counts
    in_run = np.arange(total, dtype=np.int64) - np.repeat(first_of_run, counts)
    lengths = 8 + key_sizes + np.maximum(value_sizes, 0)
    position = np.repeat(starts, counts) + np.repeat(lengths, counts) * in_run
    key_size = np.repeat(key_sizes, counts)
    value_size = np.repeat(value_sizes, counts)
    removed = value_size == -1
    skip = np.where(removed, np.minimum(prefix, key_size), 0)
    value_starts = position + 8 + key_size + prefix
    sizes = value_size - prefix
    value_lengths = np.where(removed, 0, sizes // 8 * 8 if whole_words else sizes)
    return _Framed(
        records, position + 4 + skip, key_size - skip, value_starts, value_lengths, removed
    )


def _replay(files: list[_Framed]) -> StateRecords:
    """Every record of ``files``, in order, in one buffer."""
    data = b"".join(f.records for f in files)
    bases = np.cumsum([0] + [len(f.records) for f in files[:-1]])
    key_starts, value_starts = (
        np.concatenate([getattr(f, name) + base for f, base in zip(files, bases, strict=True)])
        for name in ("key_starts", "value_starts")
    )
    removed = np.concatenate([f.removed for f in files])
    return StateRecords(
        data, key_starts, np.concatenate([f.key_lengths for f in files]),
        value_starts, np.concatenate([f.value_lengths for f in files]),
        removed if removed.any() else None,
    )  # fmt: skip
