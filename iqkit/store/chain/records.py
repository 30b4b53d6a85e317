"""Version records of the SST-chain format: what a store version is on an object root.

A partition version is an ordered chain of immutable SST files (one base, then one delta
per commit; store/chain/write.py writes them), and a store version is one small JSON record
listing, per partition, its chain (names and sizes), the partition's commit record (its
position and counts: what lag and traces need without fetching any SST), the version
whose commit wrote it, and, for the store, ``created_at``, ``source_end`` and
``metadata`` (``next_record``: what a version carries forward from the one before).

Nothing on the root is ever renamed or rewritten. Publishing version N is one
``create_exclusive`` of ``<store>/chain/<N zero-padded>.json``: of two writers racing for
N exactly one succeeds, the other gets ``VersionConflictError``. There is no mutable
LATEST pointer: the latest version is the last record a listing returns (the padding
makes name order numeric order). A writer that crashed before publishing left only SSTs
no record lists, which no reader ever opens (retention removes them).

The padding bounds version numbers: 1 to ``MAX_CHAIN_VERSION`` (twelve nines). A larger
number would get a longer name that listings skip, so a commit acknowledged under it
would be invisible, and every later commit would conflict with it. Publishing past the
bound is refused (``VersionLimitError``, before anything is uploaded); reading one is
"no such version"; a longer name on the root is not a record.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from ...errors import (
    ObjectExistsError,
    StoreCorruptedError,
    VersionConflictError,
    VersionLimitError,
)
from ...query.position import Position
from ..integrity import is_checksum, seal_json, unseal_json
from ..names import CHAIN_RECORD_DIGITS, CHAIN_RECORDS_DIR, CHAIN_SST_DIR, twin_key
from ..objects import ObjectStore, check_key
from ..partitions.partition import parse_commit_record
from ..sinks import carry_forward as carry_sinks_forward

__all__ = [
    "MAX_CHAIN_VERSION",
    "ROWS_AT_MOST",
    "ChainFile",
    "ChainVersion",
    "checked_partitions",
    "PartitionChain",
    "check_next_version",
    "describe_versions",
    "next_record",
    "no_such_version",
    "latest_version",
    "list_versions",
    "publish_version",
    "read_version",
    "read_version_of_partition",
    "record_key",
    "version_of",
]

#: The highest version number a record name holds (module docstring).
MAX_CHAIN_VERSION = 10**CHAIN_RECORD_DIGITS - 1


#: The commit record's upper bound on the rows of the chain (write.py sets it when
#: the commit knows its puts): 0 says the partition is empty without opening it.
ROWS_AT_MOST = "rows_at_most"


@dataclass(frozen=True)
class ChainFile:
    """One immutable SST of a chain: its key on the root and its size in bytes, and the
    size of its columnar twin (``store/columnar/twins.py``; its key is ``twin_key(name)``)
    when it has one (None: written by an earlier iqkit, or a window store's); each with
    its checksum (``store/integrity.py``; None: written before files carried one)."""

    name: str
    size: int
    twin: int | None = None
    checksum: str | None = None
    twin_checksum: str | None = None

    @property
    def twin_readable(self) -> bool:
        """Whether it has a twin a Parquet reader may be handed: one with a checksum to
        check first (integrity.py: a twin without one is read through RocksDB)."""
        return self.twin is not None and self.twin_checksum is not None

    @property
    def twin_name(self) -> str | None:
        return twin_key(self.name) if self.twin is not None else None

    def object_keys(self) -> tuple[str, ...]:
        """Its keys on the root: the SST's, then its twin's if it has one."""
        twin = self.twin_name
        return (self.name,) if twin is None else (self.name, twin)


def _file_json(f: ChainFile) -> dict[str, Any]:
    data: dict[str, Any] = {"name": f.name, "size": f.size}
    if f.checksum is not None:
        data["checksum"] = f.checksum
    if f.twin is not None:
        data["twin"] = f.twin
        if f.twin_checksum is not None:
            data["twin_checksum"] = f.twin_checksum
    return data


def _checksum_json(value: Any) -> str | None:
    if value is None:
        return None
    if not is_checksum(value):
        raise ValueError(f"not a checksum: {str(value)[:60]!r}")
    return str(value)


@dataclass(frozen=True)
class PartitionChain:
    """One partition as of a version: its SSTs, oldest (the base) first."""

    files: tuple[ChainFile, ...]
    #: The partition's commit record as ``partition.encode_commit_record`` wrote it
    #: (the same bytes the chain's newest SST holds under ``COMMIT_KEY``).
    commit: bytes
    #: The version whose commit wrote this chain (later versions may carry it unchanged).
    written_by: int

    @property
    def deltas(self) -> int:
        """Files above the base."""
        return max(0, len(self.files) - 1)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def twinned(self) -> bool:
        """Whether every file has a twin with a checksum (scans may then read the twins
        alone; a twin with none is never handed to a Parquet reader, integrity.py)."""
        return all(f.twin_readable for f in self.files)

    def object_keys(self) -> set[str]:
        """Every key on the root the chain needs: its SSTs and their twins."""
        return {k for f in self.files for k in f.object_keys()}

    def commit_record(self) -> dict[str, Any]:
        """The decoded commit record (position as a ``Position``)."""
        return parse_commit_record(self.commit, f"the chain of version {self.written_by}")

    @staticmethod
    def holds_no_rows(commit_record: dict[str, Any]) -> bool:
        """Whether a chain with this decoded commit record is known to hold no rows (its
        ``ROWS_AT_MOST`` is 0): readers answer it as empty, opening nothing."""
        return commit_record.get(ROWS_AT_MOST) == 0

    def to_json(self) -> dict[str, Any]:
        # A chain read from a record keeps that record's JSON of it (``from_json``): the
        # next version carries most chains unchanged, and decoding each one's commit
        # again was most of a commit's time with 10,000 partitions.
        kept = self.__dict__.get("_json")
        if kept is not None:
            return kept  # type: ignore[no-any-return]
        return {
            "files": [_file_json(f) for f in self.files],
            "commit": json.loads(self.commit),
            "written_by": self.written_by,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionChain:
        chain = cls(
            files=tuple(
                ChainFile(
                    str(f["name"]),
                    int(f["size"]),
                    None if f.get("twin") is None else int(f["twin"]),
                    _checksum_json(f.get("checksum")),
                    _checksum_json(f.get("twin_checksum")),
                )
                for f in data["files"]
            ),
            commit=json.dumps(data["commit"], sort_keys=True).encode(),
            written_by=int(data["written_by"]),
        )
        object.__setattr__(chain, "_json", data)  # not a field: see ``to_json``
        return chain


@dataclass(frozen=True)
class ChainVersion:
    """A published store version (module docstring): the version, each partition's SST
    chain (only partitions some commit wrote), when, the source's end offsets and
    free-form facts."""

    version: int
    partitions: dict[int, PartitionChain]
    created_at: float = field(default_factory=time.time)
    #: The end offsets of the store's source when this version was committed, as a
    #: ``Position`` map (topic -> partition -> log-end offset), if the writer knew them.
    source_end: dict[str, dict[int, int]] | None = None
    #: Free-form facts about the commit (writer host/pid, Spark batch id, ...).
    metadata: dict[str, Any] = field(default_factory=dict)

    def files(self) -> set[str]:
        """Every key on the root this version needs: SSTs and their twins."""
        return {k for chain in self.partitions.values() for k in chain.object_keys()}

    def to_json(self) -> str:
        """The record's text, sealed with its checksum (integrity.py)."""
        return seal_json(
            json.dumps(
                {
                    "version": self.version,
                    "partitions": {str(p): c.to_json() for p, c in sorted(self.partitions.items())},
                    "created_at": self.created_at,
                    "source_end": _position_map_to_json(self.source_end),
                    "metadata": self.metadata,
                },
                indent=1,
                sort_keys=True,
            )
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        data = json.loads(text)
        return cls(
            version=int(data["version"]),
            partitions={int(p): PartitionChain.from_json(e) for p, e in data["partitions"].items()},
            created_at=float(data.get("created_at", 0.0)),
            source_end=_position_map_from_json(data.get("source_end")),
            metadata=dict(data.get("metadata") or {}),
        )

    @classmethod
    def parse(cls, text: str | bytes, version: int, where: str) -> Self:
        """The record of ``version`` read from ``where``: ``StoreCorruptedError`` when it
        cannot be parsed or names another version."""
        raw = text.encode() if isinstance(text, str) else text
        try:
            record = cls.from_json(unseal_record(raw, where))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise StoreCorruptedError(f"{where} is damaged: {exc}") from exc
        if record.version != version:
            raise StoreCorruptedError(f"{where} is damaged: it says version {record.version}")
        return record

    def check_partitions(self, partitions: int, where: str) -> Self:
        """This record, when every partition it lists is one of the store's
        (``0 .. partitions - 1``, the manifest's count); else ``StoreCorruptedError``
        naming ``where``: a record listing partition 10**9 of a two-partition store is
        damage, which readers report and never open or iterate over."""
        for p in self.partitions:
            if not 0 <= p < partitions:
                raise StoreCorruptedError(
                    f"{where} is damaged: it lists partition {p}, and the store has "
                    f"{partitions} (0..{partitions - 1})"
                )
        return self


def unseal_record(raw: bytes, where: str) -> bytes:
    """A record's bytes, its checksum checked (integrity.py); ``StoreCorruptedError``
    naming ``where`` when they do not match it."""
    return unseal_json(raw, where=where)


def _position_map_to_json(m: dict[str, dict[int, int]] | None) -> Any:
    if m is None:
        return None
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(m.items())}


def _position_map_from_json(data: Any) -> dict[str, dict[int, int]] | None:
    if data is None:
        return None
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.items()}


def next_record(
    previous: ChainVersion | None,
    version: int,
    written: Mapping[int, PartitionChain],
    *,
    source_end: Position | None,
    metadata: Mapping[str, Any],
    who: str,
    replace_all: bool = False,
) -> tuple[dict[int, PartitionChain], dict[str, dict[int, int]] | None, dict[str, Any]]:
    """What the record of ``version`` holds: its partitions, source end offsets and
    metadata, given the ``previous`` record and the partitions this commit ``written``.
    The one home of what a version carries forward:

    * partitions the commit did not write keep their entries (an overwrite,
      ``replace_all``, keeps none);
    * source end offsets only grow: they merge with the previous ones;
    * streaming sinks' last batch ids carry forward (``sinks.carry_forward``), so any
      later version still recognises a replayed batch;
    * the writer (``who``, pid, host) and the partitions written are recorded.
    """
    if previous is not None and previous.source_end is not None:
        source_end = Position.from_map(previous.source_end).merge(source_end)
    kept = {} if replace_all or previous is None else previous.partitions
    sinks = carry_sinks_forward(
        previous.metadata if previous else None, metadata.get("sinks", {}), version
    )
    return (
        {**kept, **written},
        source_end.to_map() if source_end is not None else None,
        {
            **metadata,
            **({"sinks": sinks} if sinks else {}),
            "writer": {"who": who, "pid": os.getpid(), "host": socket.gethostname()},
            "partitions_written": sorted(written),
        },
    )


def describe_versions(numbers: list[int]) -> str:
    """``6..8``, ``3`` or ``none``: version numbers (ascending) in messages."""
    if not numbers:
        return "none"
    return f"{numbers[0]}..{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


def no_such_version(store: str, version: int, retained: list[int]) -> str:
    """The message for a version that is not there (never published, or removed by
    retention): ``store 's' has no version 2 (retained: 6..8)``."""
    return f"store {store!r} has no version {version} (retained: {describe_versions(retained)})"


def record_key(store: str, version: int) -> str:
    """The key of ``store``'s record of ``version`` on its root."""
    return f"{store}/{CHAIN_RECORDS_DIR}/{record_name(version)}"


def record_name(version: int) -> str:
    """The file name of the record of ``version`` in a store's records folder
    (``ValueError`` outside 1..``MAX_CHAIN_VERSION``: callers check the bound first)."""
    if not 1 <= version <= MAX_CHAIN_VERSION:
        raise ValueError(f"no record name for version {version} (1..{MAX_CHAIN_VERSION})")
    return f"{version:0{CHAIN_RECORD_DIGITS}d}.json"


def version_of(key: str) -> int | None:
    """The version a record key names, None for any other name (a longer or shorter
    number than ``record_name`` writes is no record)."""
    stem, _dot, ext = key.rpartition("/")[2].partition(".")
    if ext == "json" and len(stem) == CHAIN_RECORD_DIGITS and stem.isascii() and stem.isdigit():
        number = int(stem)
        return number if number >= 1 else None
    return None


def check_next_version(store: str, version: int) -> None:
    """``VersionLimitError`` when ``version`` is past the highest a record can name: the
    one check of the bound, made before a commit uploads anything and again on publish."""
    if version > MAX_CHAIN_VERSION:
        raise VersionLimitError(
            f"store {store!r} cannot publish version {version}: its latest, "
            f"{version - 1}, is the highest a chain record can name; nothing was written "
            f"(copy the store's data into a new store to write on)"
        )


def list_versions(objects: ObjectStore, store: str) -> list[int]:
    """Numbers of ``store``'s published versions, ascending (one listing request)."""
    found = (version_of(k) for k in objects.list(f"{store}/{CHAIN_RECORDS_DIR}"))
    return sorted(n for n in found if n is not None)


#: Records parsed lately, by their bytes: parsing a record of 10,000 partitions takes a
#: fraction of a second, and a writer reads the same ones on every commit (the latest,
#: and retention's). Keyed by content, so a record damaged since is parsed (and refused)
#: again. Records are immutable once published, and so are the parsed ones.
_PARSED: OrderedDict[tuple[str, int, bytes], ChainVersion] = OrderedDict()
_PARSED_KEPT = 8
#: Writers on several threads of one process share the memo (an engine's fan-out too).
_PARSED_LOCK = threading.Lock()


def _record_bytes(objects: ObjectStore, store: str, version: int) -> tuple[str, bytes]:
    """The key and bytes of ``version``'s record; ``LookupError`` naming the retained
    versions when it is not there (never published, removed by retention, or a number
    no record can have)."""
    if not 1 <= version <= MAX_CHAIN_VERSION:
        raise LookupError(no_such_version(store, version, list_versions(objects, store)))
    key = record_key(store, version)
    try:
        return key, objects.read_bytes(key)
    except FileNotFoundError:
        raise LookupError(no_such_version(store, version, list_versions(objects, store))) from None


def read_version(objects: ObjectStore, store: str, version: int) -> ChainVersion:
    """Version ``version`` of ``store``; ``LookupError`` naming the retained versions when
    it is not there (never published, removed by retention, or a number no record can
    have)."""
    key, raw = _record_bytes(objects, store, version)
    memo = (store, version, hashlib.sha256(raw).digest())
    with _PARSED_LOCK:
        record = _PARSED.get(memo)
        if record is not None:
            _PARSED.move_to_end(memo)
            return record
    where = objects.where(key)
    record = _check_files(ChainVersion.parse(raw, version, where), store, lambda: where)
    with _PARSED_LOCK:
        _PARSED[memo] = record
        while len(_PARSED) > _PARSED_KEPT:
            _PARSED.popitem(last=False)
    return record


def read_version_of_partition(
    objects: ObjectStore, store: str, version: int, partition: int
) -> ChainVersion:
    """Version ``version`` of ``store`` with partition ``partition``'s chain alone (its
    time, number and that chain, checked as ``read_version`` checks them all): what the
    version queries of one key read, once per retained version, where parsing every
    partition's chain of every record was most of a key's history. ``LookupError`` when
    the record is not there."""
    key, raw = _record_bytes(objects, store, version)
    try:
        data = json.loads(unseal_record(raw, objects.where(key)))
        chain = data["partitions"].get(str(partition))
        record = ChainVersion(
            version=int(data["version"]),
            partitions={} if chain is None else {partition: PartitionChain.from_json(chain)},
            created_at=float(data.get("created_at", 0.0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise StoreCorruptedError(f"{objects.where(key)} is damaged: {exc}") from exc
    if record.version != version:
        where = objects.where(key)
        raise StoreCorruptedError(f"{where} is damaged: it says version {record.version}")
    # (where the record is, for a message only: worked out only if one is needed)
    return _check_files(record, store, lambda: objects.where(key))


def _check_files(record: ChainVersion, store: str, where: Callable[[], str]) -> ChainVersion:
    """``record`` when every file it lists is in its own partition's folder
    (``<store>/sst/<p>/<name>``), else ``StoreCorruptedError``: a damaged (or hostile)
    record must not send a reader, a compaction or retention to another store's files,
    a folder, or outside the root; each name is checked here, once, for all of them."""
    for p, chain in record.partitions.items():
        folder = f"{store}/{CHAIN_SST_DIR}/{p}/"
        for f in chain.files:
            name = f.name[len(folder) :] if f.name.startswith(folder) else ""
            if not _is_file_name(name):
                raise StoreCorruptedError(
                    f"{where()} is damaged: partition {p} lists {f.name[:200]!r}, "
                    f"which is not a file of {folder}"
                )
    return record


@functools.lru_cache(maxsize=65_536)
def _is_file_name(name: str) -> bool:
    """Whether ``name`` is one file name an object key may end with (remembered: every
    version record lists the files its chains share with the versions before, and a
    reader of a run of versions checks each record)."""
    if not name or "/" in name:
        return False
    try:
        check_key(name)
    except ValueError:
        return False
    return True


def latest_version(
    objects: ObjectStore, store: str, *, partitions: int | None = None
) -> ChainVersion | None:
    """The newest published version of ``store``, or None when none was published;
    ``partitions``: the manifest's count, which every partition the record lists must be
    within (``checked_partitions``).

    The newest record listed is read; if retention removed it between the listing and
    the read (only possible for a record that is no longer the newest), list again."""
    while True:
        numbers = list_versions(objects, store)
        if not numbers:
            return None
        try:
            record = read_version(objects, store, numbers[-1])
        except LookupError:
            if list_versions(objects, store)[-1:] == numbers[-1:]:
                raise
            continue
        return (
            record if partitions is None else checked_partitions(objects, store, record, partitions)
        )


def checked_partitions(
    objects: ObjectStore, store: str, record: ChainVersion, partitions: int
) -> ChainVersion:
    """``record`` when it lists only partitions ``0 .. partitions - 1`` (the manifest's),
    else ``StoreCorruptedError`` naming the record: readers never serve such a record and
    writers never build on it (a forged partition number must not be carried forward)."""
    where = objects.where(record_key(store, record.version))
    return record.check_partitions(partitions, where)


def publish_version(objects: ObjectStore, store: str, record: ChainVersion) -> None:
    """Publish ``record`` with one exclusive create; ``VersionConflictError`` if another
    writer published that number first (this writer's SSTs are then orphans);
    ``VersionLimitError`` past the highest number (module docstring), so a commit is never
    acknowledged under a name readers do not list."""
    check_next_version(store, record.version)
    key = record_key(store, record.version)
    try:
        objects.create_exclusive(key, record.to_json().encode())
    except ObjectExistsError:
        raise VersionConflictError(
            f"store {store!r}: version {record.version} was published by another writer "
            f"first ({objects.where(key)} exists); read the latest version and commit again"
        ) from None
