"""Position deletes: which rows of a chain's older twins a newer file supersedes, found
when a delta is written, so readers merge a chain by row position instead of joining on
keys (Iceberg v2 position deletes, Delta Lake deletion vectors).

A delta's twin carries, in its footer (schema metadata ``SUPERSEDED``), one bitmap per
older file of its chain: bit ``i`` set when row ``i`` of that file is superseded by a
newer file of the chain (the delta itself included), i.e. a newer file holds its key.
The bitmaps are cumulative: the newest file's alone say which rows of every older file
are dead, so a reader reads them from one footer. Each entry names the older file (its
SST's name without folders) and its rows; a reader whose chain does not match (another
chain, an earlier iqkit's files) ignores them and merges on keys as before.

Why in the twin's footer and not a file of their own: the bitmaps are then covered by the
twin's checksum (integrity.py), published, fetched, pinned and removed by retention with
it, and a crash can never leave a version listing a twin without its deletes. A
compacted base has no older file, so compaction drops them.

What a reader does with them (``newest wins`` with no key comparison):

* ``iqkit.sql``'s view (sqlsession/twins.py) reads every file of such chains in one
  ``read_parquet(..., file_row_number = true)`` and joins, per file (a build side of one
  row per file), its bitmap as a DuckDB ``BIT``: ``get_bit(bitmap, file_row_number)``;
* ``TwinScan`` (scan.py) filters each older file's rows by the bitmap as a numpy mask.

Cost to the writer: once per commit, the key column of each older twin is decoded and
the delta's keys are looked up in it by binary search (``encoding/key_order.py``: a twin
is sorted by key), so the search costs ``log2(rows)`` key reads per delta key, not a hash
of every row; the marks of files below the previous delta are that delta's, with the
new rows added (``superseded_metadata``). What stays in proportion to the store is
decoding the older twins' key columns (about 0.05 s per million rows), 64k keys at a
time, each batch searched as it comes: a column read whole, combined and then searched
cost about 2.5 times as much CPU at 50 million keys (fresh memory for all of it, and
passes over all of it out of the CPU's cache).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..encoding.key_order import Needles, needles, rows_holding
from ..encoding.keyspace import kv_keys_arrow
from ..encoding.serdes import get_serde
from ..manifest import StoreManifest
from ..names import DATA_PREFIX, TWIN_SUFFIX
from .twins import KEY_BYTES, KEY_FROM, serialized_keys

__all__ = [
    "SUPERSEDED",
    "Superseded",
    "read_superseded",
    "superseded_metadata",
    "writing",
    "writing_enabled",
]

#: Schema metadata of a delta's twin: its chain's position deletes (module docstring).
SUPERSEDED = b"iqkit.superseded"
_FORMAT = 1
_WRITING = True
_SST_SUFFIX = ".sst"
#: Keys of a twin decoded at a time (``_twin_keys``).
_READ_ROWS = 1 << 16


@contextlib.contextmanager
def writing(enabled: bool) -> Iterator[None]:
    """Within the block, commits write their deltas' twins with position deletes
    (``True``, the default) or without, as iqkit did before them (``False``: tests mix
    such chains with new ones). Process-wide, like ``layers.twin_scans``."""
    global _WRITING
    old, _WRITING = _WRITING, enabled
    try:
        yield
    finally:
        _WRITING = old


def writing_enabled() -> bool:
    return _WRITING


def _base_name(name: str) -> str:
    """A chain file's name without folders and suffix (an SST's and its twin's are the
    same then): what the bitmaps are recorded under."""
    base = os.path.basename(name)
    for suffix in (TWIN_SUFFIX, _SST_SUFFIX):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def _twin_keys(
    path: str | os.PathLike[str], meta: pq.FileMetaData, manifest: StoreManifest
) -> tuple[Iterator[pa.Array], bool]:
    """The keys of the twin at ``path`` (its footer ``meta``), in its row order (sorted),
    as bytes, decoded a batch at a time as they are iterated (``rows_holding`` searches
    each batch while it is in the CPU's cache; a whole column read at once was most of
    a commit's time at 50 million keys): its ``__key`` column (RocksDB keys: True), or
    its key column serialized (the RocksDB keys without their prefix: False), which
    saves joining a prefix to every row."""
    twin = pq.ParquetFile(path, metadata=meta)
    derived = (twin.schema_arrow.metadata or {}).get(KEY_FROM)
    if derived is None:
        return _decoded(twin, KEY_BYTES, None), True
    return _decoded(twin, derived.decode(), get_serde(manifest.key_serde)), False


def _decoded(twin: pq.ParquetFile, column: str, serde: Any) -> Iterator[pa.Array]:
    """``column`` of ``twin`` decoded a batch at a time (serialized by ``serde``, when
    given); the file is closed once it is read."""
    with twin:
        for batch in twin.iter_batches(_READ_ROWS, columns=[column], use_threads=False):
            values = batch.column(0)
            yield values if serde is None else serialized_keys(values, serde)


def _rocks_keys(keys: list[pa.Array], prefixed: bool) -> pa.Array:
    """``_twin_keys``'s keys as RocksDB keys."""
    joined = pa.concat_arrays([k.cast(pa.binary()) for k in keys])
    return joined if prefixed else kv_keys_arrow(joined)


def _kept(chunks: Iterator[pa.Array], into: list[pa.Array]) -> Iterator[pa.Array]:
    """``chunks``, each also added to ``into``."""
    for chunk in chunks:
        into.append(chunk)
        yield chunk


def footer_schema(meta: pq.FileMetaData) -> pa.Schema:
    """A twin's Arrow schema from its footer, with its position deletes in the schema's
    metadata wherever the writer put them: a twin written a piece at a time
    (``twins.TwinWriter``) adds them to the file's key-value metadata when it closes,
    after the Arrow schema it stores (``ARROW:schema``) was fixed."""
    schema = meta.schema.to_arrow_schema()
    extra = (meta.metadata or {}).get(SUPERSEDED)
    if extra is None or (schema.metadata or {}).get(SUPERSEDED) == extra:
        return schema
    return schema.with_metadata({**(schema.metadata or {}), SUPERSEDED: extra})


def superseded_metadata(
    manifest: StoreManifest,
    older: Sequence[tuple[str, str | os.PathLike[str]]],
    new_keys: Sequence[bytes] | pa.Array,
) -> dict[bytes, bytes]:
    """The schema metadata a delta's twin carries (module docstring): ``older`` are the
    chain's files below the delta, oldest first, each as ``(its name on the root, the
    local path of its twin, checked whole)``; ``new_keys`` the delta's RocksDB keys.

    When the newest older twin carries the marks of the files below it (the previous
    commit's delta did), only the delta's keys are looked up: a file's marks are then
    that twin's plus the rows holding one of the delta's keys. Otherwise the keys of
    every newer file are looked up in each older one."""
    newer = new_keys if isinstance(new_keys, pa.Array) else pa.array(new_keys, pa.binary())
    footers = [pq.read_metadata(path) for _, path in older]
    below = read_superseded(
        footer_schema(footers[-1]).metadata,
        [(name, meta.num_rows) for (name, _), meta in zip(older[:-1], footers, strict=False)],
    )
    marks: list[np.ndarray] = []
    found = [newer]  # the RocksDB keys of the files above the one looked at
    looked_up: dict[tuple[int, bool], Needles] = {}  # by files above and form
    for i in range(len(older) - 1, -1, -1):  # newest first
        keys, prefixed = _twin_keys(older[i][1], footers[i], manifest)
        wanted = looked_up.get((len(found), prefixed))
        if wanted is None:  # the twin's form: RocksDB keys, or the user rows' without prefix
            joined = pa.concat_arrays([k.cast(pa.binary()) for k in found])
            wanted = needles(joined, b"" if prefixed else DATA_PREFIX)
            looked_up[(len(found), prefixed)] = wanted
        kept: list[pa.Array] = []
        dead = rows_holding(_kept(keys, kept) if below is None and i else keys, wanted)
        if len(dead) != footers[i].num_rows:
            raise ValueError(f"twin {older[i][0]}: {len(dead)} keys read, not its rows")
        if below is not None and i < len(older) - 1:
            live = below.mask(i)
            if live is not None:
                dead |= ~live
        elif below is None and i:
            found.append(_rocks_keys(kept, prefixed))
        marks.append(dead)
    entries = [
        {
            "name": _base_name(name),
            "rows": len(dead),
            "bits": base64.b64encode(
                pa.compress(np.packbits(dead).tobytes(), "zstd", asbytes=True)
            ).decode("ascii"),
        }
        for (name, _), dead in zip(older, reversed(marks), strict=True)
    ]
    text = json.dumps({"format": _FORMAT, "files": entries}, separators=(",", ":"))
    return {SUPERSEDED: text.encode()}


class Superseded:
    """The position deletes a chain's newest twin carries for its older files, oldest
    first: per file, its packed bitmap (``numpy.packbits``, first row in the highest bit
    of the first byte, the order of a DuckDB ``BIT``), or None when none of its rows is
    superseded."""

    __slots__ = ("bitmaps", "rows")

    def __init__(self, bitmaps: list[bytes | None], rows: list[int]) -> None:
        self.bitmaps = bitmaps
        self.rows = rows

    def mask(self, i: int) -> np.ndarray | None:
        """The rows of older file ``i`` still live (a boolean array), or None: all."""
        packed = self.bitmaps[i]
        if packed is None:
            return None
        bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8), count=self.rows[i])
        return ~bits.astype(bool)


def read_superseded(
    metadata: dict[bytes, bytes] | None, older: Sequence[tuple[str, int]]
) -> Superseded | None:
    """The position deletes in a chain's newest twin's schema ``metadata`` for its
    ``older`` files (oldest first, each as ``(its name, its rows)``), or None when it
    has none for exactly these files (an earlier iqkit's twin, another chain): the
    reader merges on keys then."""
    raw = (metadata or {}).get(SUPERSEDED)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        files = data["files"]
        if data.get("format") != _FORMAT or len(files) != len(older):
            return None
        bitmaps: list[bytes | None] = []
        for entry, (name, rows) in zip(files, older, strict=True):
            if entry["name"] != _base_name(name) or int(entry["rows"]) != rows:
                return None
            packed = base64.b64decode(entry["bits"])
            size = (rows + 7) // 8
            bitmap = pa.decompress(packed, size, "zstd", asbytes=True) if size else b""
            if len(bitmap) != size:
                return None
            bitmaps.append(bitmap if np.frombuffer(bitmap, np.uint8).any() else None)
    except (ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return Superseded(bitmaps, [rows for _, rows in older])
