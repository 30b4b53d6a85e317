"""A chain partition across a run of versions, for the version queries
(store/versions.py's ``VersionWalk``).

Consecutive versions of a chain share files: version N+1's chain is version N's plus the
files its commit added (none when the commit did not touch the partition). A *segment*
is a run of versions whose chains extend each other that way. Each segment is read
through one ``LayeredDatabase``: its first version's files ingested, then each later
version's added files, a RocksDB snapshot after each, so any version of the segment is
one point read away, and a run of 100 versions costs a database per segment (about one
per ``COMPACT_AFTER_DELTAS`` + 1 versions), not one per version. A segment's database is
built when first read, and kept by the reader (``LayeredDatabases``, least recently
used dropped past ``KEPT_DATABASES``): the next query of the same partition reuses it,
and one that reads newer versions of the segment only ingests their files (a ``%iq
watch`` of a key's history, a notebook asking again).

The keys a version's commit wrote, and their new values, are its added files' own rows,
read from the files by ``sst_reader`` (tombstones included, which RocksDB's iterators
never show), or, for files that reader does not know, the keys from their columnar twins
(``__key`` and ``__deleted``). A version whose chain does not extend the one before (a
compaction wrote one new base, an overwrite replaced the chain) has no such files: that
step is compared whole, through the two versions' partitions, and the trace says so.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from ...errors import IqkitError
from ..integrity import remembering
from ..partitions.builds import LayeredDatabase
from ..partitions.sst_reader import MISSING, SstFile, UnsupportedSst
from .read import check_sst, open_sst_in_place, pin_checked, place_on_root, plan_twin_scan
from .records import ChainFile, ChainVersion, PartitionChain

__all__ = ["KEPT_DATABASES", "ChainVersionWalk", "LayeredDatabases"]

_UNREAD = object()

#: Layered databases a reader keeps between queries (each holds a descriptor per file).
KEPT_DATABASES = 32
#: SST files a reader keeps open for single-key reads (a descriptor each): a history of
#: 100 versions reads about 110.
KEPT_SST_FILES = 128


class _Checked:
    """An ``SstFile`` whose damage found mid-read (a block's checksum) is remembered for
    the process (``integrity.remembering``), so the partition's other query shapes fail
    the same way."""

    __slots__ = ("_path", "_place", "_sst")

    def __init__(self, sst: SstFile, place: str, path: Any) -> None:
        self._sst, self._place, self._path = sst, place, path

    def get(self, key: bytes) -> object:
        with remembering(self._place, self._path):
            return self._sst.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes | None]]:
        with remembering(self._place, self._path):
            yield from self._sst.items()

    def close(self) -> None:
        self._sst.close()


def _extends(older: PartitionChain | None, newer: PartitionChain | None) -> bool:
    """Whether ``newer`` is ``older`` plus files (or the same chain); no chain counts as
    an empty one, which every chain extends."""
    if newer is None:
        return older is None
    if older is None:
        return True
    n = len(older.files)
    return newer.files[:n] == older.files


class _Kept:
    """A kept layered database: the files of each of its layers, what pins them, and how
    many walks read it now."""

    def __init__(self, db: LayeredDatabase, layers: list[tuple[str, ...]], holds: Any) -> None:
        self.db = db
        self.layers = layers
        self.holds = holds
        self.readers = 0

    def close(self) -> None:
        try:
            self.db.close()
        finally:
            with contextlib.suppress(IqkitError):
                self.holds.close()


class LayeredDatabases:
    """The layered databases one reader keeps (module docstring), by partition and the
    files of their first layer."""

    def __init__(self, snapshot: Any, kept: int = KEPT_DATABASES) -> None:
        self._snapshot = snapshot
        self._kept = kept
        self._dbs: OrderedDict[tuple[int, tuple[str, ...]], _Kept] = OrderedDict()
        #: SST files open for single-key reads (``sst``), least recently used first.
        self._ssts: OrderedDict[str, tuple[SstFile, Any]] = OrderedDict()

    def sst(self, f: ChainFile) -> SstFile:
        """The chain file ``f`` open for ``sst_reader`` reads (kept, up to
        ``KEPT_SST_FILES``): in place on a local root, through no link, checked for its
        size; else the cache's copy, pinned while open (checked when fetched).
        ``UnsupportedSst`` when the reader does not know it; ``StoreCorruptedError``
        (remembered: integrity.py) when it is damaged."""
        name = f.name
        kept = self._ssts.get(name)
        if kept is not None:
            self._ssts.move_to_end(name)
            return kept[0]
        objects = self._snapshot.objects
        place = place_on_root(objects, name)
        holds = contextlib.ExitStack()
        try:
            if objects.root.is_local:  # in place, opened through no link
                fh = holds.enter_context(open_sst_in_place(objects, f))
            else:
                pin = pin_checked(self._snapshot.cache, objects, name, f.size, f.checksum)
                holds.callback(pin.release)
                fh = open(pin.path, "rb")  # noqa: SIM115 (closed with the SstFile)
            with remembering(place, fh.fileno()):
                sst = _Checked(SstFile(fh, name=place), place, fh.fileno())  # open while kept
        except BaseException:
            holds.close()
            raise
        self._ssts[name] = (sst, holds)  # type: ignore[assignment]
        while len(self._ssts) > KEPT_SST_FILES:
            _name, (old, old_holds) = self._ssts.popitem(last=False)
            old.close()
            old_holds.close()
        return sst  # type: ignore[return-value]

    def acquire(self, p: int, layers: list[list[Any]]) -> tuple[_Kept, int]:
        """A database holding ``layers`` (lists of ``ChainFile``s) as its first layers,
        marked read until ``release``; and how many files this call ingested."""
        names = [tuple(f.name for f in layer) for layer in layers]
        key = (p, names[0])
        entry = self._dbs.get(key)
        if entry is not None and entry.layers[: len(names)] != names[: len(entry.layers)]:
            if not entry.readers:
                self._dbs.pop(key).close()
            entry = None  # another history of the same base (not a prefix of this one)
        ingested = 0
        if entry is None:
            entry = self._open(names[:1], [layers[0]])
            ingested = len(layers[0])
            if key not in self._dbs:
                self._dbs[key] = entry
        for i in range(len(entry.layers), len(names)):
            entry.db.add_layer(self._sources(entry, layers[i]))
            entry.layers.append(names[i])
            ingested += len(layers[i])
        if key in self._dbs:
            self._dbs.move_to_end(key)
        entry.readers += 1
        self._shrink()
        return entry, ingested

    def release(self, entry: _Kept) -> None:
        entry.readers -= 1
        if entry.readers == 0 and entry not in self._dbs.values():
            entry.close()
        self._shrink()

    def _sources(self, entry: _Kept, files: list[Any]) -> list[tuple[Any, str]]:
        """``files`` as local paths for a layered database, each checked for its size
        (RocksDB checks their blocks as it reads them; integrity.py)."""
        objects, cache = self._snapshot.objects, self._snapshot.cache
        names = [f.name for f in files]
        paths = entry.holds.enter_context(cache.sources(objects, names))
        for f, path in zip(files, paths, strict=True):
            check_sst(objects, f, path, whole=False)
        return [(path, place_on_root(objects, n)) for path, n in zip(paths, names, strict=True)]

    def _open(self, names: list[tuple[str, ...]], layers: list[list[Any]]) -> _Kept:
        holds = contextlib.ExitStack()
        entry = _Kept(None, list(names), holds)  # type: ignore[arg-type]
        try:
            entry.db = LayeredDatabase([self._sources(entry, layer) for layer in layers])
        except BaseException:
            holds.close()
            raise
        return entry

    def _shrink(self) -> None:
        for key in list(self._dbs):
            if len(self._dbs) <= self._kept:
                return
            if not self._dbs[key].readers:
                self._dbs.pop(key).close()

    def close(self) -> None:
        entries, self._dbs = list(self._dbs.values()), OrderedDict()
        for entry in entries:
            entry.close()
        ssts, self._ssts = list(self._ssts.values()), OrderedDict()
        for sst, holds in ssts:
            sst.close()
            with contextlib.suppress(IqkitError):
                holds.close()


class _Segment:
    """Versions whose chains extend each other, read through one layered database."""

    def __init__(self, first: int) -> None:
        self.versions: list[int] = [first]
        #: Per version, the index of its layer (versions that added nothing share one).
        self.layer_of: dict[int, int] = {}
        self.layers: list[list[Any]] = []  # ChainFiles per layer
        self.db: LayeredDatabase | None = None
        self.kept: _Kept | None = None


class ChainVersionWalk:
    """``VersionWalk`` of partition ``p`` of a ``ChainSnapshot`` over ``records``."""

    def __init__(self, snapshot: Any, p: int, records: dict[int, ChainVersion]) -> None:
        self._snapshot = snapshot
        self._p = p
        self._records = records
        self._chains = {v: r.partitions.get(p) for v, r in sorted(records.items())}
        self._segments: dict[int, _Segment] = {}  # version -> its segment
        self._holds = contextlib.ExitStack()
        self._built = 0
        self._reused = 0
        self._files = 0
        self._from_deltas = 0
        self._compared: list[int] = []
        #: Single-key reads through the files themselves (``get``): the files open,
        #: what each gave per key, and whether one turned out unreadable that way.
        self._ssts: dict[str, SstFile] = {}
        self._values: dict[tuple[str, bytes], object] = {}
        self._files_unreadable = False
        self._read_keys = 0
        #: Per version read for a change feed, the rows its own files hold (key -> value,
        #: None for a delete), within the query's bounds.
        self._written: dict[int, dict[bytes, bytes | None]] = {}
        self._plan()

    def _plan(self) -> None:
        previous: PartitionChain | None = None
        segment: _Segment | None = None
        for v, chain in self._chains.items():
            if chain is None:
                segment = None  # no rows: ``get`` answers without a database
            elif segment is None or not _extends(previous, chain):
                segment = _Segment(v)
                segment.layers.append(list(chain.files))
                segment.layer_of[v] = 0
            else:
                added = chain.files[len(previous.files) :] if previous is not None else ()
                if added:
                    segment.layers.append(list(added))
                segment.versions.append(v)
                segment.layer_of[v] = len(segment.layers) - 1
            if segment is not None:
                self._segments[v] = segment
            previous = chain

    def _database(self, segment: _Segment, layer: int | None = None) -> LayeredDatabase:
        """The segment's layered database holding at least its layers up to ``layer``
        (None: all). Reads of many keys go in order of versions, so asking only up to
        the layer read makes it the newest one, read in one batch (``get_many``); a
        later version's read extends the same database by its files."""
        wanted = len(segment.layers) if layer is None else layer + 1
        if segment.db is None or segment.db.layers < wanted:
            kept, ingested = self._snapshot.layered.acquire(self._p, segment.layers[:wanted])
            if segment.kept is not kept:
                self._holds.callback(self._snapshot.layered.release, kept)
            else:
                self._snapshot.layered.release(kept)  # held once per walk
            segment.kept, segment.db = kept, kept.db
            if ingested:
                self._built += 1
                self._files += ingested
            else:
                self._reused += 1
        return segment.db

    def get(self, version: int, key: bytes) -> bytes | None:
        """One key at one version: read from the chain's files themselves, newest first
        (``sst_reader``; each file read once per key and walk), so a key's history
        builds no database; through the segment's layered database when a file is not
        one the reader knows."""
        chain = self._chains.get(version)
        if chain is None:
            return None
        if not self._files_unreadable:
            try:
                for f in reversed(chain.files):
                    value = self._file_value(f, key)
                    if value is not MISSING:
                        return value  # type: ignore[return-value]
                return None
            except UnsupportedSst:
                self._files_unreadable = True
        segment = self._segments[version]
        return self._database(segment).get(segment.layer_of[version], key)

    def _file_value(self, f: ChainFile, key: bytes) -> object:
        name = f.name
        found = self._values.get((name, key), _UNREAD)
        if found is _UNREAD:
            sst = self._ssts.get(name)
            if sst is None:
                sst = self._ssts[name] = self._open_sst(f)
            found = self._values[(name, key)] = sst.get(key)
            self._read_keys += 1
        return found

    def _open_sst(self, f: ChainFile) -> SstFile:
        return self._snapshot.layered.sst(f)  # type: ignore[no-any-return]

    def get_many(self, version: int, keys: list[bytes]) -> list[bytes | None]:
        written = self._written.get(version)
        if written is not None and all(k in written for k in keys):
            return [written[k] for k in keys]  # what the version's own files hold
        segment = self._segments.get(version)
        if segment is None:
            return [None] * len(keys)
        layer = segment.layer_of[version]
        return self._database(segment, layer).get_many(layer, keys)

    def written_keys(self, version: int, lower: bytes, upper: bytes) -> list[bytes] | None:
        chain = self._chains.get(version)
        versions = list(self._chains)
        i = versions.index(version)
        previous = self._chains[versions[i - 1]] if i else None
        if chain is None:
            if previous is None:
                return []  # empty before and after
            self._compared.append(version)
            return None
        if previous is not None and chain.commit == previous.commit:
            return []  # no commit wrote here: a compaction's version, or none at all
        if previous is not None and not _extends(previous, chain):
            self._compared.append(version)
            return None
        added = chain.files[len(previous.files) :] if previous is not None else chain.files
        if not added:
            return []
        try:
            rows: dict[bytes, bytes | None] = {}
            for f in added:  # in commit order: a later file's row wins
                rows.update(self._snapshot.layered.sst(f).items())
        except UnsupportedSst:
            return self._written_keys_from_twins(version, chain, added, lower, upper)
        self._from_deltas += 1
        written = {k: v for k, v in rows.items() if lower <= k < upper}
        self._written[version] = written
        return sorted(written)

    def _written_keys_from_twins(
        self, version: int, chain: PartitionChain, added: Any, lower: bytes, upper: bytes
    ) -> list[bytes] | None:
        """``written_keys`` from the files' columnar twins (``__key`` and ``__deleted``),
        for files the SST reader does not know; None (compare) without twins."""
        if not all(f.twin_readable for f in added):
            self._compared.append(version)
            return None
        snapshot = self._snapshot
        part = PartitionChain(files=tuple(added), commit=chain.commit, written_by=version)
        scan = plan_twin_scan(
            snapshot.cache, snapshot.objects, part, snapshot.manifest, lower, upper, False
        )
        if scan is None:  # twins of another layout
            self._compared.append(version)
            return None
        self._from_deltas += 1
        try:
            return scan.written_keys()  # type: ignore[no-any-return]
        finally:
            scan.close()

    def scan(self, version: int, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        record = self._records[version]
        partition = self._snapshot.partition(record, self._p).partition
        for chunk in partition.scan_chunks(lower, upper):
            yield from chunk

    def notes(self) -> list[str]:
        notes = []
        if self._built or self._reused:
            notes.append(
                f"{self._built} layered database{'s' if self._built != 1 else ''} built or "
                f"extended ({self._files} files ingested), {self._reused} reused"
            )
        if self._read_keys:
            files = len(self._ssts)
            notes.append(
                f"{self._read_keys} key reads in {files} SST file{'s' if files != 1 else ''}"
            )
        if self._from_deltas:
            notes.append(f"{self._from_deltas} versions' changes read from their delta files")
        if self._compared:
            listed = ", ".join(str(v) for v in self._compared)
            notes.append(
                f"version {listed} compared whole with the version before "
                "(no delta files: a compaction, an overwrite or files without twins)"
            )
        return notes or ["nothing read"]

    def close(self) -> None:
        with contextlib.suppress(IqkitError):
            self._holds.close()
